"""Reports built from stored data; needs no GPU and imports no op."""
