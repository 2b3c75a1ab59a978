//! A stream's hand-over between replicas, through Redis.
//!
//! What a stream's next answer depends on is its [`Record`]: the model's
//! explicit state ([`StreamState`], which carries the model's identity), the
//! position (chunks, or pulses, consumed), and what the stream's protocol
//! keeps beside the model (Silero's 64 samples of context and speech
//! hysteresis; nothing for a model served as tensors), checked by the
//! protocol before the stream resumes. A replica writes it under the stream's id
//! when it drains (then closes the stream with 1012) and, with
//! `checkpoint_every` K > 0, after every K-th chunk (so a replica killed
//! outright loses at most K chunks). A replica admitting a stream whose id
//! has a record continues it from there and tells the client where
//! (`x-resume-chunk` on the upgrade, and a first `{"resume": n}` message):
//! the client resends its audio from chunk n.
//!
//! Every store operation is bounded by `store_timeout_ms` (connecting
//! included: the client's own timeouts are set to it), and a store that
//! fails or hangs costs a log line and a counter, never a stream: the
//! hand-over is then skipped (the stream drains as it would without a
//! store), a checkpoint is skipped, a lookup starts the stream fresh. After
//! a failure the store is not tried for a while (the store's circuit), so
//! a dead store costs each operation nothing more than a check. A
//! checkpoint is written off the answer path (at most one in flight per
//! stream; one due while the last is still in flight is dropped and
//! counted). A record that does not parse, is larger than
//! [`MAX_RECORD_BYTES`] (refused before it is read), holds a field out of
//! range, is of another format version, or of another model (the runner
//! refuses it) starts the stream fresh too, with a log line; it is never
//! imported.
//!
//! Each record carries the writing session's *generation* (one more than
//! the record it resumed from, 1 for a fresh stream) and its *owner* (a
//! token of the session): a write lands only over a record of a lower
//! generation, or of the same generation and owner, so a session that
//! resumed from an older record (or a second session resuming from the
//! same one, on another replica) can never overwrite a newer one; a clean
//! close deletes the record only if it is still its own. A client
//! reconnecting claims the generation it was told (`x-resume-generation`):
//! a record of a lower one (the newer lost: Redis replicates
//! asynchronously, so a failover may lose the last writes) is never
//! resumed from; the stream restarts at 0, told why ([`RESTARTED`]).
//!
//! The store is one Redis (`redis://`) or a Redis Cluster
//! (`redis+cluster://host:port,...`, [`cluster_nodes`]): every operation is
//! a script on one key, so on a cluster it runs on the key's slot's
//! master, the client following `MOVED` and `ASK`. On one replica,
//! a stream id is live in one session at most: a second connection with
//! the id is refused (1008) while the first lives.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use laned_runner::StreamState;
use redis::aio::MultiplexedConnection;
use redis::cluster_async::ClusterConnection;
use serde::{Deserialize, Serialize};

/// The version [`Record`]s are written in, and the only one read (2: the
/// generation and owner; the runner's state format 2).
pub const RECORD_VERSION: u32 = 2;

/// The largest record written to or read from the store, in bytes: a
/// larger one is not written (the hand-over fails, said) and is refused by
/// its length before it is read (a Silero record is a few KiB, a
/// DeepFilterNet3 one about 370 KB, its ops' state lifted).
pub const MAX_RECORD_BYTES: u64 = 1024 * 1024;

/// The longest stream id accepted.
pub const MAX_ID_BYTES: usize = 128;

/// The furthest position a record may hold, in chunks (over a thousand
/// years of 32 ms chunks): a larger one is refused, so the answer numbers
/// never wrap.
pub const MAX_RECORD_CHUNK: u64 = 1 << 40;

/// The prefix of `vad-server`'s keys: a stream's record is under
/// `laned:vad:stream:<id>`. A model served by `laned serve` keeps its
/// streams under `laned:model:<name>:stream:<id>` ([`key_prefix`]).
pub const KEY_PREFIX: &str = "laned:vad:stream:";

/// The prefix of the keys of model `name`'s streams under `laned serve`.
pub fn key_prefix(name: &str) -> String {
    format!("laned:model:{name}:stream:")
}

/// Everything a stream's next answer depends on, as the store keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// [`RECORD_VERSION`] when written.
    pub version: u32,
    /// Chunks (pulses) consumed: the next one the stream answers.
    pub chunk: u64,
    /// The model's explicit state, with the model's identity.
    pub state: StreamState,
    /// The writing session's generation: one more than the record it
    /// resumed from, 1 for a fresh stream.
    pub generation: u64,
    /// The writing session's token (see the module's doc).
    pub owner: String,
    /// Written at the stream's last answer, by a session that answers no
    /// more (a v2 sequence's hand-over on a drain): a v2 request without
    /// `sequence_start` may continue the sequence from it, once (the
    /// session continuing it marks it not current before its first
    /// answer). A checkpoint (answers may follow it) and a WebSocket
    /// stream's hand-over (its client is told the position) are not.
    #[serde(default)]
    pub current: bool,
    /// What the stream's protocol keeps beside the model's state (for
    /// `vad-server`: `context`, `speaking`, `silence_from`), checked by the
    /// protocol before the stream resumes; every other field lands here.
    #[serde(flatten)]
    pub framing: serde_json::Map<String, serde_json::Value>,
}

impl Record {
    /// The record of a stream at `chunk`.
    pub(crate) fn of(
        chunk: u64,
        framing: serde_json::Map<String, serde_json::Value>,
        state: StreamState,
        writer: &Writer,
    ) -> Record {
        Record {
            version: RECORD_VERSION,
            chunk,
            state,
            generation: writer.generation,
            owner: writer.owner.clone(),
            current: false,
            framing,
        }
    }

    /// The bytes stored.
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a record serialises")
    }

    /// A record read back, checked for what neither the runner nor the
    /// protocol checks (the format version, the position's and the
    /// generation's range); the model's identity and the state's tensors
    /// are the runner's to check, the framing fields the protocol's.
    pub fn from_bytes(bytes: &[u8]) -> Result<Record, String> {
        let record: Record = serde_json::from_slice(bytes).map_err(|e| format!("not a record: {e}"))?;
        if record.version != RECORD_VERSION {
            return Err(format!(
                "a record of version {}, this server reads version {RECORD_VERSION}",
                record.version
            ));
        }
        if record.chunk > MAX_RECORD_CHUNK {
            return Err(format!(
                "a position of chunk {}, past the limit of {MAX_RECORD_CHUNK}",
                record.chunk
            ));
        }
        if record.generation == 0 || record.generation > MAX_RECORD_CHUNK {
            return Err(format!("a generation of {}", record.generation));
        }
        Ok(record)
    }
}

/// The reasons a stream whose client claims a generation
/// (`x-resume-generation`) is restarted at 0, as its hello's `restarted`
/// says them; the first word is the kind, and the outcome
/// `laned_resume_total` counts it under.
pub const RESTARTED: [&str; 4] = [STALE, LOST, UNREAD, REFUSED];

/// The record held is of an older generation than the client knew: the
/// newer one was lost (a store's failover, or its restart).
pub const STALE: &str =
    "stale: the record held is of an older generation than the stream's (a newer one was lost): restarted at chunk 0";
/// No record is held for a stream the client had started.
pub const LOST: &str = "lost: no record is held for the stream: restarted at chunk 0";
/// The store failed the lookup.
pub const UNREAD: &str = "unread: the store could not be read: restarted at chunk 0";
/// The record held could not be resumed from (unreadable, too large, of
/// another model or version).
pub const REFUSED: &str = "refused: the record held could not be resumed from: restarted at chunk 0";

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

/// Who writes a stream's records: its session's generation and owner
/// token (see the module's doc).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Writer {
    pub generation: u64,
    pub owner: String,
}

impl Writer {
    /// A session's writer, one generation past `resumed` (the generation of
    /// the record it found, if any), with a token no other session has.
    pub(crate) fn after(resumed: Option<u64>) -> Writer {
        static SESSIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = SESSIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let started = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        Writer {
            generation: resumed.unwrap_or(0).saturating_add(1),
            owner: format!("{:x}-{started:x}-{n:x}", std::process::id()),
        }
    }
}

/// Writes `ARGV[1]` under `KEYS[1]` with a TTL of `ARGV[4]` s, unless the
/// record there is of a higher generation than `ARGV[2]`, or of the same
/// generation and another owner than `ARGV[3]`; a record that does not
/// decode, or is over `ARGV[5]` bytes (never read), is overwritten.
/// Returns 1 written, 0 refused.
const PUT: &str = r#"
local held = nil
if redis.call('STRLEN', KEYS[1]) <= tonumber(ARGV[5]) then
  held = redis.call('GET', KEYS[1])
end
if held then
  local ok, record = pcall(cjson.decode, held)
  if ok and type(record) == 'table' and tonumber(record.generation) then
    local theirs, mine = tonumber(record.generation), tonumber(ARGV[2])
    if theirs > mine or (theirs == mine and record.owner ~= ARGV[3]) then
      return 0
    end
  end
end
redis.call('SET', KEYS[1], ARGV[1], 'EX', tonumber(ARGV[4]))
return 1
"#;

/// The record under `KEYS[1]` if it holds at most `ARGV[1]` bytes, its
/// length (an integer) if it holds more, nil if there is none.
const GET: &str = r#"
local n = redis.call('STRLEN', KEYS[1])
if n == 0 then return false end
if n > tonumber(ARGV[1]) then return n end
return redis.call('GET', KEYS[1])
"#;

/// Deletes `KEYS[1]` if the record there is the session's own (generation
/// `ARGV[1]`, owner `ARGV[2]`) or of an older generation (the record the
/// session resumed from, superseded: a session that ends cleanly before
/// writing its own leaves nothing to resume from); never a newer
/// session's.
const REMOVE_OWN: &str = r#"
local held = redis.call('GET', KEYS[1])
if not held then return 0 end
local ok, record = pcall(cjson.decode, held)
if ok and type(record) == 'table' and tonumber(record.generation) then
  local theirs, mine = tonumber(record.generation), tonumber(ARGV[1])
  if theirs < mine or (theirs == mine and record.owner == ARGV[2]) then
    return redis.call('DEL', KEYS[1])
  end
end
return 0
"#;

/// The hand-over store: a Redis server or a Redis Cluster, connected
/// lazily, every operation bounded by `timeout`, and a *circuit*: after an
/// operation fails, none is tried for [`Store::cooldown`] (each fails at
/// once, said so), so a store down or hung costs the streams no wait.
/// Every operation is a script on one key, so on a cluster it goes to the
/// master of the key's slot (the cluster client follows `MOVED` and `ASK`).
pub(crate) struct Store {
    client: Client,
    connection: Mutex<Option<Connection>>,
    timeout: Duration,
    ttl_s: u64,
    /// Until when the circuit is open (no operation tried).
    open_until: Mutex<Option<Instant>>,
    put: redis::Script,
    get: redis::Script,
    remove_own: redis::Script,
}

/// The client of the store a URL names.
enum Client {
    /// `redis://` (or `rediss://`, `unix://`): one server.
    Single(redis::Client),
    /// `redis+cluster://host:port,...`: a cluster, found from its nodes
    /// (boxed: the larger of the two by far).
    Cluster(Box<redis::cluster::ClusterClient>),
}

/// A connection to the store, cheap to clone (both are multiplexed).
#[derive(Clone)]
enum Connection {
    Single(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl redis::aio::ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> redis::RedisFuture<'a, redis::Value> {
        match self {
            Connection::Single(c) => c.req_packed_command(cmd),
            Connection::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        match self {
            Connection::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Connection::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Single(c) => c.get_db(),
            Connection::Cluster(c) => c.get_db(),
        }
    }
}

impl Connection {
    /// Runs `cmd` on the master of `key`'s slot (the one server, where
    /// there is one), on the connection the store's scripts use.
    async fn on_master_of(&mut self, key: &[u8], cmd: redis::Cmd) -> redis::RedisResult<redis::Value> {
        use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, Slot, SlotAddr};
        match self {
            Connection::Single(c) => cmd.query_async(c).await,
            Connection::Cluster(c) => {
                let route = Route::with_slot(Slot::for_key(key), SlotAddr::Master);
                c.route_command(cmd, RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route)))
                    .await
            }
        }
    }
}

/// The scheme of a Redis Cluster store's URL.
pub const CLUSTER_SCHEME: &str = "redis+cluster://";

/// The nodes a `redis+cluster://host:port,host:port,...` URL lists, as
/// `redis://host:port/` URLs (a trailing `/` is let through); `Err` naming
/// the URL and what was wanted for anything else.
pub fn cluster_nodes(url: &str) -> Result<Vec<String>, String> {
    let wanted = "a redis+cluster URL is redis+cluster://host:port,host:port,... (one node or more)";
    let Some(list) = url.strip_prefix(CLUSTER_SCHEME) else {
        return Err(format!("store {url:?}: {wanted}"));
    };
    let list = list.strip_suffix('/').unwrap_or(list);
    list.split(',')
        .map(|node| {
            let port = node.rsplit_once(':').and_then(|(host, port)| {
                let plain =
                    !host.is_empty() && host.bytes().all(|b| b.is_ascii_alphanumeric() || b"-.[]:".contains(&b));
                port.parse::<u16>().ok().filter(|p| plain && *p > 0)
            });
            match port {
                Some(_) => Ok(format!("redis://{node}/")),
                None => Err(format!("store {url:?}: {node:?} is not a host:port; {wanted}")),
            }
        })
        .collect()
}

/// Why a store operation failed.
#[derive(Debug)]
pub(crate) struct StoreError(String);

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// What a lookup found.
pub(crate) enum Found {
    Nothing,
    Bytes(Vec<u8>),
    /// A record over [`MAX_RECORD_BYTES`], left unread: its length.
    TooBig(u64),
}

impl Store {
    /// A store at `url`: `redis://host:port/` (one server) or
    /// `redis+cluster://host:port,...` (a cluster, any of its nodes);
    /// nothing is connected yet.
    pub(crate) fn open(url: &str, timeout: Duration, ttl_s: u64) -> Result<Store, String> {
        let client = if url.starts_with(CLUSTER_SCHEME) {
            // The cluster client's timeouts are per node and overall: the
            // setting, so none of its defaults cuts an operation first
            // (each operation is bounded by the setting here too).
            let cluster = redis::cluster::ClusterClientBuilder::new(cluster_nodes(url)?)
                .connection_timeout(timeout)
                .response_timeout(timeout)
                .build()
                .map_err(|e| format!("store {url:?}: {e}"))?;
            Client::Cluster(Box::new(cluster))
        } else {
            Client::Single(redis::Client::open(url).map_err(|e| format!("store {url:?}: {e}"))?)
        };
        Ok(Store {
            client,
            connection: Mutex::new(None),
            timeout,
            ttl_s,
            open_until: Mutex::new(None),
            put: redis::Script::new(PUT),
            get: redis::Script::new(GET),
            remove_own: redis::Script::new(REMOVE_OWN),
        })
    }

    /// How long the circuit stays open after a failure: four timeouts, a
    /// second at least.
    pub(crate) fn cooldown(&self) -> Duration {
        (self.timeout * 4).max(Duration::from_secs(1))
    }

    /// The connection, made within the timeout if there is none. The
    /// client's own connect and response timeouts are the setting too, so
    /// that none of its defaults (1 s, 500 ms) cuts an operation first.
    async fn connection(&self, until: Instant) -> Result<Connection, StoreError> {
        if let Some(c) = self.connection.lock().unwrap_or_else(|e| e.into_inner()).clone() {
            return Ok(c);
        }
        let left = until.saturating_duration_since(Instant::now());
        let connecting = async {
            match &self.client {
                Client::Single(client) => {
                    let config = redis::AsyncConnectionConfig::new()
                        .set_connection_timeout(Some(left))
                        .set_response_timeout(Some(self.timeout));
                    client
                        .get_multiplexed_async_connection_with_config(&config)
                        .await
                        .map(Connection::Single)
                }
                Client::Cluster(client) => client.get_async_connection().await.map(Connection::Cluster),
            }
        };
        let c = tokio::time::timeout(left, connecting)
            .await
            .map_err(|_| StoreError(format!("no connection to the store within {:?}", self.timeout)))?
            .map_err(|e| StoreError(format!("connecting to the store: {e}")))?;
        *self.connection.lock().unwrap_or_else(|e| e.into_inner()) = Some(c.clone());
        Ok(c)
    }

    /// Runs `op` on the connection within the timeout; a failure drops the
    /// connection (the next operation connects again) and opens the
    /// circuit.
    async fn bounded<T, F, Fut>(&self, what: &str, op: F) -> Result<T, StoreError>
    where
        F: FnOnce(Connection) -> Fut,
        Fut: std::future::Future<Output = redis::RedisResult<T>>,
    {
        if let Some(until) = *self.open_until.lock().unwrap_or_else(|e| e.into_inner()) {
            if Instant::now() < until {
                return Err(StoreError(format!(
                    "{what}: not tried, the store failed within the last {:?}",
                    self.cooldown()
                )));
            }
        }
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
        let mut open = self.open_until.lock().unwrap_or_else(|e| e.into_inner());
        match result {
            Err(_) => {
                *self.connection.lock().unwrap_or_else(|e| e.into_inner()) = None;
                *open = Some(Instant::now() + self.cooldown());
            }
            Ok(_) => *open = None,
        }
        result
    }

    /// Writes `record` under stream `id`, with the TTL, unless a newer
    /// session's record is there (refused, said so); the bytes written.
    pub(crate) async fn put(&self, key: &str, record: &Record) -> Result<usize, StoreError> {
        let (key, named) = (key.to_string(), key.to_string());
        let (bytes, generation, owner, ttl) = (record.to_bytes(), record.generation, record.owner.clone(), self.ttl_s);
        let n = bytes.len();
        if n as u64 > MAX_RECORD_BYTES {
            return Err(StoreError(format!(
                "writing the record: {n} bytes, over the {MAX_RECORD_BYTES}-byte limit (no replica would read it)"
            )));
        }
        let written: i64 = self
            .bounded("writing the record", |mut c| async move {
                self.put
                    .key(key)
                    .arg(bytes)
                    .arg(generation)
                    .arg(owner)
                    .arg(ttl)
                    .arg(MAX_RECORD_BYTES)
                    .invoke_async(&mut c)
                    .await
            })
            .await?;
        if written == 0 {
            return Err(StoreError(format!(
                "writing the record: a newer session of {named} holds it (this one is of generation {generation})"
            )));
        }
        Ok(n)
    }

    /// Waits until a replica of `key`'s master holds every write this
    /// store made there before (`WAIT 1`, for half the timeout), where the
    /// master has a replica (`INFO replication`); at once where it has
    /// none. For a write a failover must not undo: a v2 sequence's record
    /// marked no longer current (else the replica promoted would hold it
    /// current again, and another replica continue the sequence from its
    /// old position).
    pub(crate) async fn replicated(&self, key: &str) -> Result<(), StoreError> {
        let wait_ms = (self.timeout.as_millis() as u64 / 2).max(1);
        let key_bytes = key.as_bytes().to_vec();
        let acked: i64 = self
            .bounded("waiting for a replica", |mut c| async move {
                let mut info = redis::cmd("INFO");
                info.arg("replication");
                let info: String = redis::from_redis_value(c.on_master_of(&key_bytes, info).await?)?;
                let replicas = info
                    .lines()
                    .find_map(|l| l.strip_prefix("connected_slaves:"))
                    .and_then(|n| n.trim().parse::<u64>().ok())
                    .unwrap_or(0);
                if replicas == 0 {
                    return Ok(-1);
                }
                let mut wait = redis::cmd("WAIT");
                wait.arg(1).arg(wait_ms);
                Ok::<i64, redis::RedisError>(redis::from_redis_value(c.on_master_of(&key_bytes, wait).await?)?)
            })
            .await?;
        match acked {
            0 => Err(StoreError(format!(
                "waiting for a replica: none holds the write within {wait_ms} ms"
            ))),
            _ => Ok(()),
        }
    }

    /// What is under stream `id`: its bytes when at most
    /// [`MAX_RECORD_BYTES`], else only their length.
    pub(crate) async fn get(&self, key: &str) -> Result<Found, StoreError> {
        let key = key.to_string();
        let found: redis::Value = self
            .bounded("reading the record", |mut c| async move {
                self.get.key(key).arg(MAX_RECORD_BYTES).invoke_async(&mut c).await
            })
            .await?;
        match found {
            redis::Value::Nil => Ok(Found::Nothing),
            redis::Value::Int(n) => Ok(Found::TooBig(n as u64)),
            redis::Value::BulkString(bytes) => Ok(Found::Bytes(bytes)),
            other => Err(StoreError(format!("reading the record: the store answered {other:?}"))),
        }
    }

    /// Removes stream `id`'s record if it is still `writer`'s (the stream
    /// ended cleanly; a newer session's record stays).
    pub(crate) async fn remove_own(&self, key: &str, writer: &Writer) -> Result<(), StoreError> {
        let key = key.to_string();
        let (generation, owner) = (writer.generation, writer.owner.clone());
        self.bounded("removing the record", |mut c| async move {
            self.remove_own
                .key(key)
                .arg(generation)
                .arg(owner)
                .invoke_async::<i64>(&mut c)
                .await
        })
        .await
        .map(|_| ())
    }
}

/// The counters of the hand-over, through the `metrics` facade (the
/// recorder `/metrics` renders), each labelled with the served `model`'s
/// name (`vad` for `vad-server`) and the `outcome`:
/// `laned_handover_total` (a drained stream's record written, `ok`, or
/// not, `failed`; `restarted`: its model's state does not travel, the
/// stream told to start again at 0), `laned_checkpoint_total` (`ok`, `failed`, `dropped`),
/// `laned_resume_total` (`resumed`, `fresh`: no record, `refused`: a
/// record unreadable or of another model, `failed`: the store failed).
pub(crate) fn count(name: &'static str, model: &str, outcome: &'static str) {
    metrics::counter!(name, "model" => model.to_string(), "outcome" => outcome).increment(1);
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

    /// A record reads back whole (its framing fields included) and is
    /// refused for another version, a position or generation out of range.
    #[test]
    fn a_record_reads_back_and_refuses_other_versions_and_ranges() {
        let state: StreamState = serde_json::from_str(r#"{"version":3,"model":"m","tensors":[]}"#).unwrap();
        let mut framing = serde_json::Map::new();
        framing.insert("speaking".into(), true.into());
        let record = Record::of(7, framing, state, &Writer::after(None));
        let back = Record::from_bytes(&record.to_bytes()).unwrap();
        assert_eq!(back, record);
        assert_eq!(back.framing["speaking"], true);
        let mut other = record.clone();
        other.version = 1;
        assert!(Record::from_bytes(&other.to_bytes()).unwrap_err().contains("version 1"));
        assert!(Record::from_bytes(b"\x00garbage").is_err());
        let refused = |change: &dyn Fn(&mut Record), words: &str| {
            let mut r = record.clone();
            change(&mut r);
            let e = Record::from_bytes(&r.to_bytes()).unwrap_err();
            assert!(e.contains(words), "{e:?} should say {words:?}");
        };
        refused(&|r| r.chunk = u64::MAX, "position");
        refused(&|r| r.generation = 0, "generation");
    }

    /// A `redis+cluster://` URL lists host:port nodes; anything else is
    /// refused naming the URL, the part and the form wanted.
    #[test]
    fn cluster_urls_list_nodes_or_are_refused_by_name() {
        assert_eq!(
            cluster_nodes("redis+cluster://127.0.0.1:7000,redis-b:7001/").unwrap(),
            ["redis://127.0.0.1:7000/", "redis://redis-b:7001/"]
        );
        for bad in [
            "redis+cluster://",
            "redis+cluster://h:7000,,h:7001",
            "redis+cluster://h",
            "redis+cluster://h:0",
            "redis+cluster://h:99999",
            "redis+cluster://:pw@h:7000",
            "redis://h:7000",
        ] {
            let e = cluster_nodes(bad).unwrap_err();
            assert!(e.contains(bad) && e.contains("host:port"), "{bad}: {e}");
        }
    }

    /// Each session's writer is one generation past what it resumed, with
    /// a token of its own.
    #[test]
    fn writers_are_ordered_by_generation_and_told_apart() {
        let (a, b) = (Writer::after(None), Writer::after(None));
        assert_eq!((a.generation, b.generation), (1, 1));
        assert_ne!(a.owner, b.owner);
        assert_eq!(Writer::after(Some(7)).generation, 8);
        assert_eq!(Writer::after(Some(u64::MAX)).generation, u64::MAX);
    }
}
