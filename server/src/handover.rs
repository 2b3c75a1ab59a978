//! A stream's hand-over between replicas, through Redis.
//!
//! What a stream's next answer depends on is its [`Record`]: the model's
//! explicit state ([`StreamState`], which carries the model's identity), the
//! 64 samples kept from the last chunk, the speech hysteresis, and the
//! position (chunks consumed). A replica writes it under the stream's id
//! when it drains (then closes the stream with 1012) and, with
//! `checkpoint_every` K > 0, after every K-th chunk (so a replica killed
//! outright loses at most K chunks). A replica admitting a stream whose id
//! has a record continues it from there and tells the client where
//! (`x-resume-chunk` on the upgrade, and a first `{"resume": n}` message):
//! the client resends its audio from chunk n.
//!
//! Every store operation is bounded by `store_timeout_ms`, and a store
//! that fails or hangs costs a log line and a counter, never a stream: the
//! hand-over is then skipped (the stream drains as it would without a
//! store), a checkpoint is skipped, a lookup starts the stream fresh. A
//! record that does not parse, of another format version, or of another
//! model (the runner refuses it) starts the stream fresh too, with a log
//! line; it is never imported.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use laned_models::silero::{Context, CONTEXT};
use laned_runner::StreamState;
use redis::aio::MultiplexedConnection;
use redis::AsyncCommands;
use serde::{Deserialize, Serialize};

use crate::Hysteresis;

/// The version [`Record`]s are written in, and the only one read.
pub const RECORD_VERSION: u32 = 1;

/// The longest stream id accepted.
pub const MAX_ID_BYTES: usize = 128;

/// The prefix of the store's keys: a stream's record is under
/// `laned:vad:stream:<id>`.
pub const KEY_PREFIX: &str = "laned:vad:stream:";

/// Everything a stream's next answer depends on, as the store keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Record {
    /// [`RECORD_VERSION`] when written.
    pub version: u32,
    /// Chunks consumed: the next chunk the stream answers.
    pub chunk: u64,
    /// The samples kept from the last chunk, as `f32` bits (exact).
    pub context: Vec<u32>,
    /// The hysteresis: in speech, and since which chunk below the end
    /// threshold.
    pub speaking: bool,
    /// See `speaking`.
    pub silence_from: Option<u64>,
    /// The model's explicit state, with the model's identity.
    pub state: StreamState,
}

impl Record {
    /// The record of a stream at `chunk`.
    pub(crate) fn of(chunk: u64, context: &Context, hysteresis: &Hysteresis, state: StreamState) -> Record {
        Record {
            version: RECORD_VERSION,
            chunk,
            context: context.samples().iter().map(|s| s.to_bits()).collect(),
            speaking: hysteresis.speaking,
            silence_from: hysteresis.silence_from,
            state,
        }
    }

    /// The bytes stored.
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a record serialises")
    }

    /// A record read back, checked for what the runner does not check
    /// (the format version, the context's length); the model's identity and
    /// the state's tensors are the runner's to check on import.
    pub fn from_bytes(bytes: &[u8]) -> Result<Record, String> {
        let record: Record = serde_json::from_slice(bytes).map_err(|e| format!("not a record: {e}"))?;
        if record.version != RECORD_VERSION {
            return Err(format!(
                "a record of version {}, this server reads version {RECORD_VERSION}",
                record.version
            ));
        }
        if record.context.len() != CONTEXT {
            return Err(format!(
                "a context of {} samples, {CONTEXT} expected",
                record.context.len()
            ));
        }
        Ok(record)
    }

    /// The context it holds.
    pub(crate) fn context(&self) -> Context {
        Context::from_samples(self.context.iter().map(|b| f32::from_bits(*b)).collect())
            .expect("the length is checked on reading")
    }

    /// The hysteresis it holds.
    pub(crate) fn hysteresis(&self) -> Hysteresis {
        Hysteresis {
            speaking: self.speaking,
            silence_from: self.silence_from,
        }
    }
}

/// A stream id from a client (the `x-stream-id` header or the `stream`
/// URL parameter), checked: 1 to [`MAX_ID_BYTES`] bytes of ASCII letters,
/// digits, `-`, `_`, `.`, `:`.
pub fn check_id(id: &str) -> Result<(), String> {
    if id.is_empty() || id.len() > MAX_ID_BYTES {
        return Err(format!("a stream id of {} bytes: 1 to {MAX_ID_BYTES}", id.len()));
    }
    if !id
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'))
    {
        return Err("a stream id holds only ASCII letters, digits and - _ . :".into());
    }
    Ok(())
}

/// The hand-over store: a Redis server, connected lazily, every operation
/// bounded.
pub(crate) struct Store {
    client: redis::Client,
    connection: Mutex<Option<MultiplexedConnection>>,
    timeout: Duration,
    ttl_s: u64,
}

/// Why a store operation failed.
#[derive(Debug)]
pub(crate) struct StoreError(String);

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl Store {
    /// A store at `url` (`redis://host:port/`); nothing is connected yet.
    pub(crate) fn open(url: &str, timeout: Duration, ttl_s: u64) -> Result<Store, String> {
        let client = redis::Client::open(url).map_err(|e| format!("store {url:?}: {e}"))?;
        Ok(Store {
            client,
            connection: Mutex::new(None),
            timeout,
            ttl_s,
        })
    }

    /// The connection, made within the timeout if there is none.
    async fn connection(&self, until: Instant) -> Result<MultiplexedConnection, StoreError> {
        if let Some(c) = self.connection.lock().unwrap_or_else(|e| e.into_inner()).clone() {
            return Ok(c);
        }
        let left = until.saturating_duration_since(Instant::now());
        let c = tokio::time::timeout(left, self.client.get_multiplexed_async_connection())
            .await
            .map_err(|_| StoreError(format!("no connection to the store within {:?}", self.timeout)))?
            .map_err(|e| StoreError(format!("connecting to the store: {e}")))?;
        *self.connection.lock().unwrap_or_else(|e| e.into_inner()) = Some(c.clone());
        Ok(c)
    }

    /// Runs `op` on the connection within the timeout; a failure drops the
    /// connection (the next operation connects again).
    async fn bounded<T, F, Fut>(&self, what: &str, op: F) -> Result<T, StoreError>
    where
        F: FnOnce(MultiplexedConnection) -> Fut,
        Fut: std::future::Future<Output = redis::RedisResult<T>>,
    {
        let until = Instant::now() + self.timeout;
        let result = match self.connection(until).await {
            Ok(c) => {
                let left = until.saturating_duration_since(Instant::now());
                match tokio::time::timeout(left, op(c)).await {
                    Ok(Ok(v)) => Ok(v),
                    Ok(Err(e)) => Err(StoreError(format!("{what}: {e}"))),
                    Err(_) => Err(StoreError(format!("{what}: no answer within {:?}", self.timeout))),
                }
            }
            Err(e) => Err(StoreError(format!("{what}: {e}"))),
        };
        if result.is_err() {
            *self.connection.lock().unwrap_or_else(|e| e.into_inner()) = None;
        }
        result
    }

    /// Writes `bytes` under stream `id`, with the TTL.
    pub(crate) async fn put(&self, id: &str, bytes: Vec<u8>) -> Result<(), StoreError> {
        let (key, ttl) = (format!("{KEY_PREFIX}{id}"), self.ttl_s);
        self.bounded("writing the record", |mut c| async move {
            c.set_ex::<_, _, ()>(key, bytes, ttl).await
        })
        .await
    }

    /// The bytes under stream `id`, if any.
    pub(crate) async fn get(&self, id: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let key = format!("{KEY_PREFIX}{id}");
        self.bounded("reading the record", |mut c| async move {
            c.get::<_, Option<Vec<u8>>>(key).await
        })
        .await
    }

    /// Removes stream `id`'s record (the stream ended).
    pub(crate) async fn remove(&self, id: &str) -> Result<(), StoreError> {
        let key = format!("{KEY_PREFIX}{id}");
        self.bounded("removing the record", |mut c| async move { c.del::<_, ()>(key).await })
            .await
    }
}

/// The counters of the hand-over, through the `metrics` facade (the
/// recorder `/metrics` renders): `laned_handover_total{outcome}` (a
/// drained stream's record written, `ok`, or not, `failed`),
/// `laned_checkpoint_total{outcome}`, `laned_resume_total{outcome}`
/// (`resumed`, `fresh`: no record, `refused`: a record unreadable or of
/// another model, `failed`: the store failed).
pub(crate) fn count(name: &'static str, outcome: &'static str) {
    metrics::counter!(name, "outcome" => outcome).increment(1);
}

/// The hand-overs of one drain, for its summary line.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    pub handed_over: u64,
    pub failed: u64,
    pub bytes: u64,
    /// The exports from the runner, summed, and the slowest.
    pub export: Duration,
    pub max_export: Duration,
    /// The writes to the store, summed, and the slowest.
    pub write: Duration,
    pub max_write: Duration,
}

impl Tally {
    pub(crate) fn add(&mut self, bytes: usize, export: Duration, write: Duration) {
        self.handed_over += 1;
        self.bytes += bytes as u64;
        self.export += export;
        self.max_export = self.max_export.max(export);
        self.write += write;
        self.max_write = self.max_write.max(write);
    }

    pub(crate) fn summary(&self) -> String {
        let n = self.handed_over.max(1) as u128;
        format!(
            "handed over {} streams ({} failed): {} bytes each on average; export {} us on average, {} us at most; \
             write {} us on average, {} us at most",
            self.handed_over,
            self.failed,
            self.bytes as u128 / n,
            self.export.as_micros() / n,
            self.max_export.as_micros(),
            self.write.as_micros() / n,
            self.max_write.as_micros()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_ids_are_checked() {
        check_id("call-17").unwrap();
        check_id("a.b_c:9").unwrap();
        assert!(check_id("").is_err());
        assert!(check_id("a b").is_err());
        assert!(check_id("é").is_err());
        assert!(check_id(&"x".repeat(MAX_ID_BYTES + 1)).is_err());
    }

    #[test]
    fn a_record_reads_back_and_refuses_other_versions_and_contexts() {
        let state: StreamState = serde_json::from_str(r#"{"version":1,"model":"m","tensors":[]}"#).unwrap();
        let mut context = Context::default();
        context.inputs(&[0.25; laned_models::silero::CHUNK]);
        let record = Record::of(7, &context, &Hysteresis::default(), state);
        let back = Record::from_bytes(&record.to_bytes()).unwrap();
        assert_eq!(back, record);
        assert_eq!(back.context().samples(), context.samples());
        let mut other = record.clone();
        other.version = 2;
        assert!(Record::from_bytes(&other.to_bytes()).unwrap_err().contains("version 2"));
        other = record.clone();
        other.context.pop();
        assert!(Record::from_bytes(&other.to_bytes()).is_err());
        assert!(Record::from_bytes(b"\x00garbage").is_err());
    }
}
