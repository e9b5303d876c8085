//! End-to-end tests against the local control plane in `hack/`; the scenarios arrive with the end-to-end issue.
