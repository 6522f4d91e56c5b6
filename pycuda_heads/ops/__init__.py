"""One module per kernel family: the Op subclass and the KernelSpec of each of its kernels.
The catalog finds every module here; adding a family means adding a module and its .cu file."""
