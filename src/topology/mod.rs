//! Machine topology: NUMA nodes, NICs, RDMA devices, GPUs, and the priority matrix.
