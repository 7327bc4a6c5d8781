//! The Kubernetes runtime (SPEC §7), for `plumber daemon`: the [`crd::Topology`] resource that
//! carries each topology's status and durable cutover record, and [`render`], the objects of
//! each processor identity (a StatefulSet and KEDA's [`keda`] objects). Applying them and the
//! lease come with the runtime itself; the daemon's configuration file is
//! `crate::daemon::config`.

pub mod apply;
pub mod cache;
pub mod crd;
pub mod drift;
pub mod keda;
pub mod lease;
pub mod render;
