//! Watches the processing loop from a thread of its own, for what the loop cannot do while a
//! transform holds it:
//!
//! - **A record past its deadline** (`--record-timeout`). jq (jaq) evaluates on the loop's
//!   thread and cannot be interrupted, and no thread can be stopped from outside, so the
//!   overseer takes the loop's place: it dead-letters the record (kind `timeout`, its value
//!   read again from the input topic), commits, leaves the group and replaces the process
//!   with a fresh start of the same command (`exec`): the runaway evaluation ends with the
//!   old process image, no core keeps burning, and no supervisor restart is needed.
//!   Transforms that honour the deadline themselves (exec, http) get [`BACKSTOP`] more first.
//!   Nothing here knows what the transform is: any engine that cannot be interrupted is
//!   handled the same way.
//! - **A stop while such a transform runs**: once the in-flight grace is over, the overseer
//!   abandons the record (uncommitted), commits what came before it, leaves the group and
//!   ends the process.
//! - **Commits while a transform runs long**: what the records before it sent is committed
//!   every commit interval, so no transaction stays open for a transform's duration.

use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::config::Config;
use crate::delivery::{Books, Committer, Consumer, KAFKA_CALL_TIMEOUT};
use crate::kafka;
use crate::pipeline::{self, Outbox};
use crate::record::{Input, Rejection};
use crate::stop::Stop;
use crate::transform;

/// How long past the deadline (or past the in-flight grace of a stop) a transform that ends
/// itself there (exec, http) still gets before the overseer takes over anyway.
pub const BACKSTOP: Duration = Duration::from_secs(2);

/// How often the overseer looks.
const TICK: Duration = Duration::from_millis(50);

/// Set in the environment of the process that replaces this one: how many times the
/// processor replaced itself so far (each time after dead-lettering a record that timed out).
pub const SELF_RESTARTS_ENV: &str = "PLUMBER_PROCESSOR_SELF_RESTARTS";

/// The longest one record can hold the processor: its budget, the backstop, then the
/// takeover (reading the record again, sending its dead letter, committing, leaving the
/// group), each step bounded by [`KAFKA_CALL_TIMEOUT`]. After that the processor has moved on
/// or replaced itself. The daemon's stall watchdog must wait longer than this.
pub fn max_record_time(config: &Config) -> Duration {
    config.record_timeout + BACKSTOP + KAFKA_CALL_TIMEOUT * 4
}

/// The record the loop is transforming, shared with the overseer.
#[derive(Default)]
pub struct Hand {
    state: Mutex<State>,
    closed: Mutex<bool>,
    wake: Condvar,
}

#[derive(Default, Clone, Copy)]
enum State {
    #[default]
    Idle,
    Transforming(InHand),
    /// The overseer took the loop's place; the loop must not touch anything again.
    TakenOver,
}

#[derive(Clone, Copy)]
pub struct InHand {
    pub slot: usize,
    pub offset: i64,
    pub started: Instant,
    pub deadline: Instant,
    pub interruptible: bool,
}

impl Hand {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The loop starts transforming a record.
    pub fn begin(&self, record: InHand) {
        let mut state = self.state();
        if let State::Idle = *state {
            *state = State::Transforming(record);
        }
    }

    /// The loop is done transforming; false when the overseer took over meanwhile (waits
    /// while it commits what came before the record).
    pub fn end(&self) -> bool {
        let mut state = self.state();
        match *state {
            State::TakenOver => false,
            _ => {
                *state = State::Idle;
                true
            }
        }
    }

    /// Ends [`Overseer::watch`].
    pub fn close(&self) {
        *self.closed.lock().unwrap_or_else(PoisonError::into_inner) = true;
        self.wake.notify_all();
    }

    /// Waits one tick; false once closed.
    fn tick(&self) -> bool {
        let closed = self.closed.lock().unwrap_or_else(PoisonError::into_inner);
        let (closed, _) = self
            .wake
            .wait_timeout_while(closed, TICK, |closed| !*closed)
            .unwrap_or_else(PoisonError::into_inner);
        !*closed
    }
}

/// Why the overseer takes the loop's place.
enum Takeover {
    TimedOut,
    Abandoned,
}

pub struct Overseer<'a> {
    pub config: &'a Config,
    pub stop: &'a Stop,
    pub consumer: &'a Consumer,
    pub committer: &'a Committer,
    pub books: &'a Books,
    pub outbox: &'a Outbox<'a>,
    pub hand: &'a Hand,
    pub progress: &'a pipeline::Progress,
}

impl Overseer<'_> {
    /// Watches until [`Hand::close`]; a takeover never returns (it ends or replaces the
    /// process).
    pub fn watch(&self) {
        let interval = self.config.commit_interval(self.committer.mode());
        // When the record in hand was first due to be abandoned (the grace after a stop is
        // over, or a second signal came).
        let mut abandon_since = None;
        while self.hand.tick() {
            let now = Instant::now();
            if abandon_since.is_none() && self.stop.abandon_in_flight() {
                abandon_since = Some(now);
            }
            let mut state = self.hand.state();
            let State::Transforming(record) = *state else {
                continue;
            };
            let slack = if record.interruptible {
                BACKSTOP
            } else {
                Duration::ZERO
            };
            let takeover = if now >= record.deadline + slack {
                Takeover::TimedOut
            } else if abandon_since.is_some_and(|since| now >= since + slack) {
                Takeover::Abandoned
            } else {
                if now.duration_since(record.started) >= interval
                    && let Err(error) = self.committer.maybe_commit(self.consumer)
                {
                    // The loop cannot send while the state is locked: the commit covers
                    // exactly the records before the one in hand.
                    self.committer.commit_failed_elsewhere(error);
                }
                continue;
            };
            *state = State::TakenOver;
            drop(state);
            match takeover {
                Takeover::TimedOut => self.dead_letter_and_restart(record),
                Takeover::Abandoned => self.abandon(record),
            }
        }
    }

    fn partition_of(&self, slot: usize) -> (String, i32) {
        self.books
            .tracker()
            .partition_of(slot)
            .map(|(topic, partition)| (topic.to_owned(), partition))
            .unwrap_or_default()
    }

    fn dead_letter_and_restart(&self, record: InHand) -> ! {
        let (topic, partition) = self.partition_of(record.slot);
        let secs = self.config.record_timeout.as_secs();
        tracing::warn!(
            topic,
            partition,
            offset = record.offset,
            record_timeout = secs,
            "the transform overran --record-timeout and cannot be interrupted: dead-lettering the record, committing, and restarting the processor"
        );
        let rejection = transform::timed_out(self.config.record_timeout, "");
        let until = Instant::now() + KAFKA_CALL_TIMEOUT * 2;
        let result = self
            .dead_letter(&topic, partition, record, rejection)
            .and_then(|()| {
                self.committer
                    .finish(self.consumer, until)
                    .map_err(pipeline::Error::from)
            });
        if result.is_ok() {
            self.progress.final_commit_made();
        }
        self.leave_group();
        if let Err(error) = result {
            self.exit(Err(error));
        }
        let restarts = self.books.metrics.self_restarts.get() + 1;
        let mut command = Command::new("/proc/self/exe");
        let mut args = std::env::args_os();
        if let Some(arg0) = args.next() {
            command.arg0(arg0);
        }
        command
            .args(args)
            .env(SELF_RESTARTS_ENV, restarts.to_string());
        tracing::info!(restarts, "restarting the processor to end the transform");
        match self.stop.exec_unless_stopping(&mut command) {
            None => self.exit(Ok(())),
            Some(error) => {
                tracing::error!(%error, "cannot restart the processor");
                std::process::exit(1)
            }
        }
    }

    /// Sends the dead letter of the record in hand, read again from its topic (or, if that
    /// fails, one that names where it is), and books it as done.
    fn dead_letter(
        &self,
        topic: &str,
        partition: i32,
        record: InHand,
        rejection: Rejection,
    ) -> Result<(), pipeline::Error> {
        self.committer.begin()?;
        let again = kafka::fetch_record(
            self.config,
            topic,
            partition,
            record.offset,
            KAFKA_CALL_TIMEOUT,
        );
        let sends = match &again {
            Ok(message) => {
                let input = pipeline::input_of(message);
                self.outbox
                    .dead_letter(&input, rejection, record.slot, None)?
            }
            Err(why) => {
                tracing::warn!(error = %why, "cannot read the record again; its dead letter names where it is");
                let input = Input::reference(topic, partition, record.offset);
                let note = format!("the record could not be read again ({why})");
                self.outbox
                    .dead_letter(&input, rejection, record.slot, Some(note))?
            }
        };
        self.committer
            .handled(topic, partition, record.slot, record.offset, sends);
        Ok(())
    }

    fn abandon(&self, record: InHand) -> ! {
        let (topic, partition) = self.partition_of(record.slot);
        self.books.metrics.abandoned.inc();
        tracing::info!(
            topic,
            partition,
            offset = record.offset,
            "record abandoned by the stop; left uncommitted"
        );
        let until = self
            .stop
            .first_request()
            .map_or_else(Instant::now, |first| first + crate::stop::STOP_LIMIT)
            .checked_sub(Duration::from_secs(1))
            .unwrap_or_else(Instant::now);
        let result = self.committer.finish(self.consumer, until);
        if result.is_ok() {
            self.progress.final_commit_made();
        }
        self.leave_group();
        self.exit(result.map_err(pipeline::Error::from));
    }

    fn leave_group(&self) {
        if !kafka::close(self.consumer, Instant::now() + KAFKA_CALL_TIMEOUT) {
            tracing::warn!(
                "leaving the group did not finish; its partitions move after the session timeout"
            );
        }
    }

    fn exit(&self, result: Result<(), pipeline::Error>) -> ! {
        let mode = Some(self.committer.mode());
        let summary = result.map(|()| pipeline::summary(mode, &self.books.metrics));
        std::process::exit(pipeline::report(summary, self.stop))
    }
}
