//! The server's settings: `vad-server`'s [`Settings`] (its model and
//! runner beside the limits), and [`Limits`], what every served model's
//! sessions share (`laned serve` reads them from its config's `[server]`
//! table).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use laned_models::silero;
use laned_runner::{Mode, RunnerConfig, StatePair, StateSpec, TurnPolicy};
use serde::de::value::{MapAccessDeserializer, StringDeserializer};
use serde::de::{DeserializeSeed, Deserializer, Error as _, IntoDeserializer, MapAccess, Visitor};
use serde::Deserialize;
use tract_core::internal::*;

use crate::CONNECTION_MARGIN;

/// The server's settings, from a TOML file, the environment and flags
/// (flags and environment over the file, the file over the defaults).
/// The file is one flat table: [`Limits`]' keys (but `grpc_listen`, which
/// is `laned serve`'s alone) beside the model's and the runner's.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// Where to listen, the limits a client meets, the drain and the
    /// hand-over store: what every served model's sessions share.
    pub limits: Limits,
    /// The Silero ONNX file; `None`: fetched (`laned_models::silero::fetch`).
    pub model: Option<PathBuf>,
    /// Lanes per shard.
    pub lanes: usize,
    /// Shards.
    pub shards: usize,
    /// `worker` or `combining`.
    pub mode: Mode,
    /// `immediate`, `linger:<us>`, `budget:<us>` or `tick:<us>`.
    pub policy: String,
    /// Where a fetched model is cached; `None`: `LANED_CACHE_DIR`, else the
    /// user's cache directory (laned-models' rule), read at run time.
    pub cache_dir: Option<PathBuf>,
    /// The SHA-256 the file at `model` must have (lowercase hex); `None`:
    /// the file is read as it is. (A fetched model is always checked
    /// against laned-models' pin.)
    pub model_sha256: Option<String>,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            limits: Limits::default(),
            model: None,
            lanes: 32,
            shards: 1,
            mode: Mode::Combining,
            policy: "immediate".into(),
            cache_dir: None,
            model_sha256: None,
        }
    }
}

impl Settings {
    /// Reads a TOML file (fields left out keep their defaults).
    pub fn from_toml_file(path: &Path) -> Result<Settings, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
        toml::from_str(&text).map_err(|e| format!("parsing {}: {e}", path.display()))
    }

    /// Refuse settings the server cannot serve with, naming the setting,
    /// the value and what it takes: checked before the model is loaded
    /// (by `vad-server`) and again by [`crate::start`].
    pub fn validate(&self) -> Result<(), String> {
        if self.lanes == 0 {
            return Err("lanes is 0: no stream could be served (at least 1)".into());
        }
        if self.shards == 0 {
            return Err("shards is 0: there would be no state to serve on (at least 1)".into());
        }
        self.limits.validate()?;
        if let Some(sha) = self
            .model_sha256
            .as_deref()
            .filter(|sha| !laned_models::fetch::is_sha256(sha))
        {
            return Err(format!("model_sha256 {sha:?} is not 64 lowercase hex digits"));
        }
        self.turn_policy().map(|_| ())
    }

    /// Connections served at once: `max_connections`, else every lane
    /// (lanes × shards) plus [`CONNECTION_MARGIN`] (clients waiting for a
    /// lane, probes, scrapes).
    pub fn connection_cap(&self) -> usize {
        self.limits.connection_cap(self.lanes.saturating_mul(self.shards))
    }

    /// The turn policy `policy` names.
    pub fn turn_policy(&self) -> Result<TurnPolicy, String> {
        parse_policy(&self.policy)
    }

    /// The runner configuration these settings describe.
    pub fn runner_config(&self) -> Result<RunnerConfig, String> {
        Ok(RunnerConfig::builder()
            .state(StateSpec::Pairs(vec![StatePair::new("state", 1)]))
            .max_lanes(self.lanes)
            .shards(self.shards)
            .mode(self.mode)
            .policy(self.turn_policy()?)
            .build())
    }
}

impl std::fmt::Display for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let model = match (&self.model, &self.cache_dir) {
            (Some(p), _) => match &self.model_sha256 {
                Some(sha) => format!("{} (checked: sha256 {sha})", p.display()),
                None => p.display().to_string(),
            },
            (None, Some(dir)) => format!("fetched (silero-vad from PyPI, checked, cached in {})", dir.display()),
            (None, None) => {
                "fetched (silero-vad from PyPI, checked, cached in LANED_CACHE_DIR or the user's cache)".into()
            }
        };
        write!(
            f,
            "listen {}\nmodel {model}\nlanes {} per shard\nshards {}\nmode {:?}\npolicy {}\n\
             drain deadline {} ms\nadmission wait {} ms\nmax frame {} bytes\nidle {} ms\n\
             connections {} at most\nheader timeout {} ms\nstore {}\ncheckpoint every {} chunks\n\
             handover ttl {} s\nstore timeout {} ms",
            self.limits.listen,
            self.lanes,
            self.shards,
            self.mode,
            self.policy,
            self.limits.drain_deadline_ms,
            self.limits.admission_wait_ms,
            self.limits.max_frame_bytes,
            self.limits.idle_ms,
            self.connection_cap(),
            self.limits.header_timeout_ms,
            self.limits.store.as_deref().unwrap_or("none (no hand-over)"),
            self.limits.checkpoint_every,
            self.limits.handover_ttl_s,
            self.limits.store_timeout_ms
        )
    }
}

/// `immediate`, `linger:<us>`, `budget:<us>`, `tick:<us>`: the runner's
/// one policy syntax ([`TurnPolicy`]'s `FromStr`).
pub fn parse_policy(s: &str) -> Result<TurnPolicy, String> {
    s.parse().map_err(|e: laned_runner::ParsePolicyError| e.to_string())
}

/// The model file the settings name: `model` (checked against
/// `model_sha256` when given), else fetched and checked into `cache_dir`
/// (else `LANED_CACHE_DIR`, else the user's cache directory). `Err` says
/// why it is unavailable.
pub fn model_file(settings: &Settings) -> Result<PathBuf, String> {
    match (&settings.model, &settings.cache_dir) {
        (Some(path), _) => {
            if let Some(want) = &settings.model_sha256 {
                let got = laned_models::fetch::sha256_of(path).map_err(|e| e.to_string())?;
                if &got != want {
                    return Err(format!("{} has sha256 {got}, model_sha256 says {want}", path.display()));
                }
            }
            Ok(path.clone())
        }
        (None, Some(dir)) => silero::fetch_in(dir).map_err(|e| e.to_string()),
        (None, None) => silero::fetch().map_err(|e| e.to_string()),
    }
}

/// The model prepared for tract's default runtime: from `model`, else
/// fetched. `Err` says why it is unavailable.
pub fn load_plan(model: Option<&Path>) -> Result<Arc<dyn Runnable>, String> {
    let path = match model {
        Some(p) => p.to_path_buf(),
        None => silero::fetch().map_err(|e| e.to_string())?,
    };
    let typed = silero::load(&path).map_err(|e| format!("{e:?}"))?;
    let plan = DefaultRuntime.prepare(typed).map_err(|e| format!("{e:?}"))?;
    Ok(plan.into())
}

/// What every served model's sessions share: where to listen, the limits
/// a client meets, the drain and the hand-over store. `vad-server`'s
/// [`Settings`] hold one; `laned serve` reads it from its config's
/// `[server]` table.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Where to listen.
    pub listen: SocketAddr,
    /// How long live streams may go on after SIGTERM, in milliseconds.
    pub drain_deadline_ms: u64,
    /// How long a new connection waits for a lane, in milliseconds.
    pub admission_wait_ms: u64,
    /// The largest binary frame accepted, in bytes.
    pub max_frame_bytes: usize,
    /// How long a connection may send no audio (pings, pongs, empty
    /// frames do not count), or leave a reply untaken, before it is closed (1008) and its lane freed, in
    /// milliseconds: a client silent, stalled mid-frame, not reading, or
    /// gone without a FIN holds a lane no longer.
    pub idle_ms: u64,
    /// Connections served at once (those reading their request and the
    /// live sessions); `None`: [`Limits::connection_cap`]'s default, the
    /// lanes plus a margin. Past it only probes are answered.
    pub max_connections: Option<usize>,
    /// How long a new connection may take to send its request head, in
    /// milliseconds: idle TCP and slowloris requests are closed then.
    pub header_timeout_ms: u64,
    /// A second address answering only the probes (`/live`, `/ready`,
    /// `/metrics`), with places of its own ([`crate::PROBE_PLACES`]): what an
    /// orchestrator's probes should ask, so that no flood of the main
    /// address can fail them. `None`: none (the main address's reserve
    /// answers them).
    pub probe_listen: Option<SocketAddr>,
    /// The hand-over store, a Redis URL (`redis://127.0.0.1:6379/`), or a
    /// Redis Cluster's nodes (`redis+cluster://host:port,host:port,...`);
    /// `None`: no hand-over (a drained stream is closed 1001, a stream
    /// always starts fresh). See [`crate::handover`].
    pub store: Option<String>,
    /// How long a stream's record lives in the store, in seconds.
    pub handover_ttl_s: u64,
    /// A checkpoint of each stream (with an id) every this many chunks, so
    /// that a replica killed outright loses at most that many; 0: none.
    pub checkpoint_every: u64,
    /// How long one store operation may take (connecting included), in
    /// milliseconds: past it, it is given up (a log line, a counter).
    pub store_timeout_ms: u64,
    /// The KServe v2 gRPC front's address (`laned serve` only); none by
    /// default.
    pub grpc_listen: Option<SocketAddr>,
    /// gRPC (`laned serve` only): the streams (calls) one connection may
    /// have open at once, HTTP/2's `SETTINGS_MAX_CONCURRENT_STREAMS` (a
    /// stream past it is refused `REFUSED_STREAM`, the client's library
    /// waits); an open stream costs the server about 16 KB.
    pub grpc_max_streams: u32,
    /// gRPC (`laned serve` only): the requests one connection's
    /// `ModelStreamInfer` streams may have received and not yet answered,
    /// all its streams and sequences together (with a sequence or not):
    /// one past it is answered `RESOURCE_EXHAUSTED` naming this bound. A
    /// request holds at most the message limit (8 × the pulse's bytes +
    /// 64 KiB).
    pub grpc_max_requests: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            listen: "127.0.0.1:8080".parse().unwrap(),
            drain_deadline_ms: 10_000,
            admission_wait_ms: 1_000,
            max_frame_bytes: 1 << 20,
            idle_ms: 30_000,
            max_connections: None,
            header_timeout_ms: 5_000,
            probe_listen: None,
            store: None,
            handover_ttl_s: 600,
            checkpoint_every: 0,
            store_timeout_ms: 500,
            grpc_listen: None,
            grpc_max_streams: 128,
            grpc_max_requests: 256,
        }
    }
}

/// The keys of `vad-server`'s file, in the order its errors list them:
/// [`Limits`]' but the gRPC front's (`grpc_*`), and the model's and the
/// runner's.
const SETTINGS_KEYS: &[&str] = &[
    "listen",
    "model",
    "lanes",
    "shards",
    "mode",
    "policy",
    "drain_deadline_ms",
    "admission_wait_ms",
    "max_frame_bytes",
    "idle_ms",
    "max_connections",
    "header_timeout_ms",
    "probe_listen",
    "store",
    "handover_ttl_s",
    "checkpoint_every",
    "store_timeout_ms",
    "cache_dir",
    "model_sha256",
];

/// `vad-server`'s file is flat: its own keys are read into [`Settings`],
/// the rest handed to [`Limits`]' own reading (so its defaults and checks
/// are the limits' own), and a key of neither refused.
impl<'de> Deserialize<'de> for Settings {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Settings, D::Error> {
        d.deserialize_struct("Settings", SETTINGS_KEYS, SettingsVisitor)
    }
}

struct SettingsVisitor;

impl<'de> Visitor<'de> for SettingsVisitor {
    type Value = Settings;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("struct Settings")
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Settings, A::Error> {
        let mut own = Settings::default();
        let limits = Limits::deserialize(MapAccessDeserializer::new(OwnKeys { map, own: &mut own }))?;
        Ok(Settings { limits, ..own })
    }
}

/// The file's map as [`Limits`] reads it: the keys that are [`Settings`]'
/// own are read into `own` on the way and never reach the limits.
struct OwnKeys<'a, A> {
    map: A,
    own: &'a mut Settings,
}

/// A key of the file: one of [`Settings`]' own (the seed handed back
/// unused), or one for [`Limits`] (read by the seed).
enum Key<K, V> {
    Own(&'static str, K),
    Limits(V),
}

/// Reads a key where the file's deserializer reads it (so that an error
/// names its place), refusing one that is not the file's.
struct KeySeed<K>(K);

impl<'de, K: DeserializeSeed<'de>> DeserializeSeed<'de> for KeySeed<K> {
    type Value = Key<K, K::Value>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        let key = String::deserialize(d)?;
        let Some(known) = SETTINGS_KEYS.iter().find(|k| **k == key) else {
            return Err(D::Error::unknown_field(&key, SETTINGS_KEYS));
        };
        match *known {
            own @ ("model" | "lanes" | "shards" | "mode" | "policy" | "cache_dir" | "model_sha256") => {
                Ok(Key::Own(own, self.0))
            }
            _ => {
                let key: StringDeserializer<D::Error> = key.into_deserializer();
                self.0.deserialize(key).map(Key::Limits)
            }
        }
    }
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for OwnKeys<'_, A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, mut seed: K) -> Result<Option<K::Value>, A::Error> {
        loop {
            match self.map.next_key_seed(KeySeed(seed))? {
                None => return Ok(None),
                Some(Key::Limits(key)) => return Ok(Some(key)),
                Some(Key::Own(name, unused)) => {
                    seed = unused;
                    let own = &mut *self.own;
                    match name {
                        "model" => own.model = self.map.next_value()?,
                        "lanes" => own.lanes = self.map.next_value()?,
                        "shards" => own.shards = self.map.next_value()?,
                        "mode" => own.mode = self.map.next_value()?,
                        "policy" => own.policy = self.map.next_value()?,
                        "cache_dir" => own.cache_dir = self.map.next_value()?,
                        _ => own.model_sha256 = self.map.next_value()?,
                    }
                }
            }
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, A::Error> {
        self.map.next_value_seed(seed)
    }
}

impl Limits {
    /// Refuse limits the server cannot serve with, naming the setting, the
    /// value and what it takes.
    pub fn validate(&self) -> Result<(), String> {
        if self.max_frame_bytes < 4 {
            return Err(format!(
                "max_frame_bytes is {}: no frame could carry a sample (at least 4)",
                self.max_frame_bytes
            ));
        }
        if self.idle_ms == 0 {
            return Err("idle_ms is 0: every connection would be closed at once (at least 1)".into());
        }
        if self.header_timeout_ms == 0 {
            return Err("header_timeout_ms is 0: no request could be read (at least 1)".into());
        }
        if self.max_connections == Some(0) {
            return Err("max_connections is 0: no client could connect (at least 1)".into());
        }
        if let Some(url) = &self.store {
            if url.starts_with(crate::handover::CLUSTER_SCHEME) {
                crate::handover::cluster_nodes(url)?;
            } else {
                redis::Client::open(url.as_str()).map_err(|e| format!("store {url:?} is not a Redis URL: {e}"))?;
            }
        }
        if self.handover_ttl_s == 0 {
            return Err("handover_ttl_s is 0: every record would expire at once (at least 1)".into());
        }
        if self.store_timeout_ms == 0 {
            return Err("store_timeout_ms is 0: no store operation could finish (at least 1)".into());
        }
        if self.grpc_max_streams == 0 {
            return Err("grpc_max_streams is 0: no gRPC call could be made (at least 1)".into());
        }
        if self.grpc_max_requests == 0 {
            return Err("grpc_max_requests is 0: no gRPC stream could carry a request (at least 1)".into());
        }
        Ok(())
    }

    /// Connections served at once: `max_connections`, else `lanes` (every
    /// served model's) plus [`CONNECTION_MARGIN`].
    pub fn connection_cap(&self, lanes: usize) -> usize {
        self.max_connections.unwrap_or(lanes.saturating_add(CONNECTION_MARGIN))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_parse() {
        assert_eq!(parse_policy("immediate"), Ok(TurnPolicy::Immediate));
        assert_eq!(parse_policy("linger:500"), Ok(TurnPolicy::Linger { us: 500 }));
        assert_eq!(parse_policy("budget:2000"), Ok(TurnPolicy::LatencyBudget { us: 2000 }));
        assert_eq!(parse_policy("tick:32000"), Ok(TurnPolicy::Tick { period_us: 32000 }));
        assert!(parse_policy("linger").is_err());
        assert!(parse_policy("soon").is_err());
    }

    #[test]
    fn settings_read_from_toml_keep_defaults_for_the_rest() {
        let s: Settings = toml::from_str("lanes = 8\nmode = \"worker\"\npolicy = \"linger:300\"\n").unwrap();
        assert_eq!(s.lanes, 8);
        assert_eq!(s.mode, Mode::Worker);
        assert_eq!(Settings::default().mode, Mode::Combining, "the runner's default");
        assert_eq!(s.shards, Settings::default().shards);
        s.runner_config().unwrap();
        assert!(toml::from_str::<Settings>("lanez = 8").is_err());
        let probes: Settings = toml::from_str("probe_listen = \"0.0.0.0:9001\"\n").unwrap();
        assert_eq!(probes.limits.probe_listen, Some("0.0.0.0:9001".parse().unwrap()));
    }

    /// vad-server's file is one flat table: every key lands where it
    /// belongs (the limits' in `limits`, the rest beside them), a key of
    /// neither (`grpc_listen` included, `laned serve`'s alone) is refused
    /// naming it and the keys the file takes, at its place in the file,
    /// and a value of the wrong type is refused naming its key.
    #[test]
    fn the_flat_file_fills_the_limits_and_refuses_other_keys() {
        let text = "listen = \"127.0.0.1:9000\"\nmodel = \"/m.onnx\"\nlanes = 3\nshards = 2\n\
                    mode = \"worker\"\npolicy = \"tick:500\"\ndrain_deadline_ms = 11\n\
                    admission_wait_ms = 12\nmax_frame_bytes = 13\nidle_ms = 14\n\
                    max_connections = 15\nheader_timeout_ms = 16\nprobe_listen = \"127.0.0.1:9001\"\n\
                    store = \"redis://127.0.0.1:1/\"\nhandover_ttl_s = 17\ncheckpoint_every = 18\n\
                    store_timeout_ms = 19\ncache_dir = \"/c\"\nmodel_sha256 = \"ab\"\n";
        let s: Settings = toml::from_str(text).unwrap();
        let want = Settings {
            limits: Limits {
                listen: "127.0.0.1:9000".parse().unwrap(),
                drain_deadline_ms: 11,
                admission_wait_ms: 12,
                max_frame_bytes: 13,
                idle_ms: 14,
                max_connections: Some(15),
                header_timeout_ms: 16,
                probe_listen: Some("127.0.0.1:9001".parse().unwrap()),
                store: Some("redis://127.0.0.1:1/".into()),
                handover_ttl_s: 17,
                checkpoint_every: 18,
                store_timeout_ms: 19,
                grpc_listen: None,
                ..Limits::default()
            },
            model: Some("/m.onnx".into()),
            lanes: 3,
            shards: 2,
            mode: Mode::Worker,
            policy: "tick:500".into(),
            cache_dir: Some("/c".into()),
            model_sha256: Some("ab".into()),
        };
        assert_eq!(s, want);
        assert_eq!(toml::from_str::<Settings>("").unwrap(), Settings::default());
        for key in ["grpc_listen = \"127.0.0.1:9002\"", "lanez = 8"] {
            let e = toml::from_str::<Settings>(&format!("lanes = 2\n{key}\n"))
                .unwrap_err()
                .to_string();
            let name = key.split(' ').next().unwrap();
            assert!(e.contains(&format!("unknown field `{name}`")), "{e}");
            assert!(e.contains("line 2"), "{e}");
            assert!(
                e.contains("expected one of `listen`, `model`, `lanes`") && e.contains("`model_sha256`"),
                "{e}"
            );
            assert!(!e.split("expected").nth(1).unwrap().contains("grpc_listen"), "{e}");
        }
        let e = toml::from_str::<Settings>("idle_ms = \"soon\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("idle_ms") && e.contains("line 1"), "{e}");
        let e = toml::from_str::<Settings>("lanes = \"many\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("lanes") && e.contains("line 1"), "{e}");
    }

    /// The limits' defaults are vad-server's, and a bad one is refused
    /// naming it.
    #[test]
    fn limits_default_as_settings_do_and_are_checked() {
        let limits: Limits = toml::from_str("idle_ms = 500\n").unwrap();
        assert_eq!(limits.idle_ms, 500);
        assert_eq!(limits.max_frame_bytes, Settings::default().limits.max_frame_bytes);
        assert_eq!(limits.connection_cap(10), 10 + CONNECTION_MARGIN);
        let bad = Limits {
            idle_ms: 0,
            ..Limits::default()
        };
        assert!(bad.validate().unwrap_err().contains("idle_ms"));
        assert!(toml::from_str::<Limits>("lanes = 8").is_err());
    }
}
