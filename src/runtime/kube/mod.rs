//! The Kubernetes runtime (SPEC §7), for `plumber daemon`: the [`crd::Topology`] resource that
//! carries each topology's status and durable cutover record, and [`config`], the daemon's
//! configuration file. Rendering the processors' objects, applying them and the lease come
//! with the runtime itself.

pub mod config;
pub mod crd;
