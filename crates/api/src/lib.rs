//! The GPUCluster API (being written by the workspace issue).
