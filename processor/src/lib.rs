//! `plumber-processor`: runs one step of a Plumber topology.
//!
//! Data enters in [`pipeline`]: a Kafka consumer group reads the step's input topics, each
//! record goes through the step's [`transform`] (jq, sql, exec or http; a stateful sql step
//! keeps its groups in [`state`], a join its table in [`table`]), its outputs are produced to
//! the output topics, and the input offset is committed only once those outputs are
//! acknowledged (at-least-once, [`delivery::Tracker`]) or inside the same transaction
//! (exactly-once). A record the transform cannot handle goes to the dead-letter topic
//! ([`record::dead_letter_headers`]), never nowhere.
//!
//! A stop request ([`stop::Stop`], SIGTERM or SIGINT) stops fetching, lets the record in hand
//! finish, flushes, commits and leaves the group, so that the next owner of the group (a
//! restarted instance or the successor of a cutover) starts exactly after the last record this
//! one produced.

pub mod config;
pub mod delivery;
pub mod handoff;
pub mod kafka;
pub mod metrics;
pub mod overseer;
pub mod pipeline;
pub mod reader;
pub mod record;
pub mod state;
pub mod stop;
pub mod table;
pub mod transform;

pub use config::{Config, DeliveryMode};
pub use pipeline::{Error, Summary, run};
