"""The runtime layer: device, arrays, kernel sources, compilation, launch spaces, kernel
declarations, the Op base and the tuned-table lookup. Imports no op and no tool."""
