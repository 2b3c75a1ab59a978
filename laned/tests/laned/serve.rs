//! `laned serve` as a newcomer runs it: models the test writes (a GRU with
//! its state as an input/output pair, a conv stack pulsified by the spec)
//! and Silero, each from the spec `laned check` printed, served by the
//! built binary on 127.0.0.1; real WebSocket clients, every answer checked
//! bit for bit against the model run alone (tract's plain state, the
//! explicit state fed back by hand).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use futures_util::{SinkExt, StreamExt};
use laned_models::fetch::or_skip;
use laned_models::spec::{Interface, Spec};
use laned_runner::{PortRef, StateSpec};
use laned_server::testing::Redis;
use laned_testkit::fixtures::{self, Layout, TdnnConfig};
use tokio_tungstenite::tungstenite::Message;
use tract_core::internal::*;

use super::{laned, save, text};

/// A `laned serve` process, killed when dropped.
pub struct Serving {
    child: Child,
    pub addr: String,
}

impl Serving {
    /// SIGTERM: the server drains, handing streams over to the store.
    pub fn terminate(&self) {
        laned_server::testing::sigterm(self.child.id());
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits for the server's exit (after [`Serving::terminate`]), up to
    /// `within`; whether it exited.
    pub fn exited_within(&mut self, within: std::time::Duration) -> bool {
        let until = std::time::Instant::now() + within;
        while std::time::Instant::now() < until {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return true;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        false
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `laned serve ARGS --listen 127.0.0.1:0` (unless ARGS name
/// `--listen`) and waits for its address; `Err` with its output where it
/// exits first.
pub fn serve(args: &[&str]) -> Result<Serving, String> {
    let listen: &[&str] = if args.contains(&"--listen") {
        &[]
    } else {
        &["--listen", "127.0.0.1:0"]
    };
    let mut child = Command::new(env!("CARGO_BIN_EXE_laned"))
        .arg("serve")
        .args(args)
        .args(listen)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    let stderr = child.stderr.take().unwrap();
    let errors = std::thread::spawn(move || std::io::read_to_string(stderr).unwrap_or_default());
    let mut said = String::new();
    let mut lines = stdout.lines();
    for line in lines.by_ref() {
        let line = line.unwrap_or_default();
        said.push_str(&line);
        said.push('\n');
        if let Some(addr) = line.strip_prefix("laned serve listening on ") {
            let addr = addr.trim().to_string();
            // Kept read, so that the server never blocks on a full pipe.
            std::thread::spawn(move || lines.map_while(Result::ok).for_each(drop));
            return Ok(Serving { child, addr });
        }
    }
    let status = child.wait().unwrap();
    Err(format!("{status}: {said}{}", errors.join().unwrap()))
}

/// The spec `laned check ARGS` prints, written to `dir/name`.
pub fn checked_spec(dir: &Path, name: &str, args: &[&str]) -> PathBuf {
    let out = laned(&[&["check"], args].concat());
    let said = text(&out);
    assert_eq!(out.status.code(), Some(0), "{said}");
    let spec = said.split("(TOML):").nth(1).unwrap().trim();
    let path = dir.join(name);
    std::fs::write(&path, spec).unwrap();
    path
}

/// One stream's answers, the model run alone: a plain tract state (any
/// state its ops keep left inside them, as tract keeps it), the explicit
/// state `pairs` (input, output) fed back by hand from zeros, or from the
/// initial value the model's spec gives.
pub fn solo(spec: &Path, pairs: &[(usize, usize)], pulses: &[Vec<u8>]) -> Vec<Vec<u8>> {
    Alone::new(spec, pairs).answers(pulses)
}

/// A model loaded once to run streams alone ([`solo`]) one after another.
pub struct Alone {
    loaded: laned_models::spec::Loaded,
    interface: Interface,
    pairs: Vec<(usize, usize)>,
}

impl Alone {
    /// The model of `spec`, its explicit state the `pairs`.
    pub fn new(spec: &Path, pairs: &[(usize, usize)]) -> Alone {
        let loaded = Spec::from_toml_file(spec).unwrap().model.load().unwrap();
        let interface = Interface::of(&loaded, pairs).unwrap();
        Alone {
            loaded,
            interface,
            pairs: pairs.to_vec(),
        }
    }

    /// The interface the model is served with.
    pub fn interface(&self) -> &Interface {
        &self.interface
    }

    /// One stream's answers, from a fresh state.
    pub fn answers(&self, pulses: &[Vec<u8>]) -> Vec<Vec<u8>> {
        let (loaded, interface, pairs) = (&self.loaded, &self.interface, &self.pairs);
        let plan = &loaded.plan;
        let mut state = plan.spawn().unwrap();
        // A pair's initial value where the model's spec gives one (a
        // built-in's), else zeros.
        let initial = |ix: usize| match &loaded.state {
            StateSpec::Pairs(given) => given
                .iter()
                .find(|p| p.input == PortRef::Index(ix))
                .and_then(|p| p.initial.as_ref()),
            _ => None,
        };
        let mut held: Vec<(usize, TValue)> = pairs
            .iter()
            .map(|(i, _)| {
                let fact = plan.input_fact(*i).unwrap();
                let shape: Vec<usize> = fact.shape.dims().iter().map(|d| d.to_usize().unwrap_or(1)).collect();
                let value = match initial(*i) {
                    Some(init) => {
                        let values: Vec<f32> = init.values.iter().map(|v| *v as f32).collect();
                        Tensor::from_shape(&init.shape, &values).unwrap()
                    }
                    None => Tensor::zero_dt(fact.datum_type, &shape).unwrap(),
                };
                (*i, value.into_tvalue())
            })
            .collect();
        pulses
            .iter()
            .map(|p| {
                let mut data = interface.call_inputs(p).unwrap().into_iter();
                let inputs: TVec<TValue> = (0..plan.input_count())
                    .map(|ix| match held.iter().find(|(i, _)| *i == ix) {
                        Some((_, v)) => v.clone(),
                        None => data.next().unwrap(),
                    })
                    .collect();
                let out = state.run(inputs).unwrap();
                for (k, (_, o)) in pairs.iter().enumerate() {
                    held[k].1 = out[*o].clone();
                }
                let answer: Vec<TValue> = (0..out.len())
                    .filter(|o| !pairs.iter().any(|(_, p)| p == o))
                    .map(|o| out[o].clone())
                    .collect();
                interface.answer_bytes(&answer).unwrap()
            })
            .collect()
    }
}

/// `count` pulses of `bytes` each: seeded noise as `f32`, in [-1, 1).
pub fn noise_pulses(seed: u64, count: usize, bytes: usize) -> Vec<Vec<u8>> {
    let mut rng = fastrand::Rng::with_seed(seed);
    (0..count)
        .map(|_| {
            (0..bytes / 4)
                .flat_map(|_| (rng.f32() * 2.0 - 1.0).to_le_bytes())
                .collect()
        })
        .collect()
}

/// A client: connects to `url`, reads the hello, sends each pulse and
/// reads its answer (binary) in turn. Returns the hello and the answers.
pub async fn client(url: &str, pulses: &[Vec<u8>]) -> (serde_json::Value, Vec<Vec<u8>>) {
    let (mut ws, _) = tokio_tungstenite::connect_async(url).await.unwrap();
    let hello = match ws.next().await.unwrap().unwrap() {
        Message::Text(t) => serde_json::from_str(&t).unwrap(),
        other => panic!("{url}: the first message is {other:?}, not the hello"),
    };
    let mut answers = Vec::new();
    for p in pulses {
        ws.send(Message::Binary(p.clone().into())).await.unwrap();
        loop {
            match ws.next().await.unwrap().unwrap() {
                Message::Binary(b) => {
                    answers.push(b.to_vec());
                    break;
                }
                Message::Ping(_) | Message::Pong(_) => continue,
                other => panic!("{url}: {other:?} where an answer was due"),
            }
        }
    }
    let _ = ws.close(None).await;
    (hello, answers)
}

/// How a client's connection ended: the close frame's code and reason.
pub async fn refused(url: &str, send: Message) -> (u16, String) {
    let (mut ws, _) = tokio_tungstenite::connect_async(url).await.unwrap();
    ws.send(send).await.unwrap();
    while let Some(m) = ws.next().await {
        if let Ok(Message::Close(Some(frame))) = m {
            return (frame.code.into(), frame.reason.to_string());
        }
        if m.is_err() {
            break;
        }
    }
    panic!("{url}: no close frame");
}

/// Every stream `streams` clients wide, each its own seed, answered as the
/// model alone answers it; the hello says the interface.
fn streams_equal_solo(serving: &Serving, name: &str, spec: &Path, pairs: &[(usize, usize)], pulses: usize) {
    let loaded = Spec::from_toml_file(spec).unwrap().model.load().unwrap();
    let interface = Interface::of(&loaded, pairs).unwrap();
    let url = format!("ws://{}/v1/models/{name}/stream", serving.addr);
    let inputs: Vec<Vec<Vec<u8>>> = (0..16)
        .map(|s| noise_pulses(s as u64 + 1, pulses, interface.pulse_bytes()))
        .collect();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let got = runtime.block_on(async {
        let tasks: Vec<_> = inputs
            .iter()
            .map(|p| {
                tokio::spawn({
                    let (url, p) = (url.clone(), p.clone());
                    async move { client(&url, &p).await }
                })
            })
            .collect();
        let mut got = Vec::new();
        for t in tasks {
            got.push(t.await.unwrap());
        }
        got
    });
    for (s, ((hello, answers), pulses)) in got.iter().zip(&inputs).enumerate() {
        assert_eq!(hello["protocol"], 1, "{hello}");
        assert_eq!(hello["model"], name, "{hello}");
        assert_eq!(hello["inputs"], serde_json::json!(interface.inputs), "{hello}");
        assert_eq!(hello["outputs"], serde_json::json!(interface.outputs), "{hello}");
        let want = solo(spec, pairs, pulses);
        assert_eq!(answers.len(), want.len(), "{name} stream {s}");
        for (k, (a, w)) in answers.iter().zip(&want).enumerate() {
            assert_eq!(a, w, "{name} stream {s}: answer {k} differs from the model run alone");
        }
    }
}

/// A GRU (its state an input/output pair) and a conv stack (pulsified by
/// its spec), written here, checked, served together by one process:
/// 16 concurrent clients each, every answer the model run alone, bit for
/// bit; `/v1/models` lists both with their interfaces.
#[test]
fn a_gru_and_a_conv_the_test_writes_are_served_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let gru = save(&fixtures::gru_cell(8, 16).unwrap().model, dir.path(), "gru.nnef.tar");
    let config = TdnnConfig {
        width: 8,
        pulse: 4,
        layout: Layout::Nchw,
    };
    let tdnn = save(&fixtures::tdnn_streaming(config).unwrap(), dir.path(), "tdnn.nnef.tar");
    let gru_spec = checked_spec(dir.path(), "gru.toml", &[&gru, "--state", "1=1"]);
    let tdnn_spec = checked_spec(dir.path(), "tdnn.toml", &[&tdnn, "--pulse", "4"]);
    let serving = serve(&[
        &format!("gru={}", gru_spec.display()),
        &format!("tdnn={}", tdnn_spec.display()),
    ])
    .unwrap();
    let listed: serde_json::Value = serde_json::from_str(&http_get(&serving.addr, "/v1/models")).unwrap();
    let names: Vec<&str> = listed["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["gru", "tdnn"], "{listed}");
    assert_eq!(
        listed["models"][0]["inputs"][0]["shape"],
        serde_json::json!([1, 8]),
        "{listed}"
    );
    streams_equal_solo(&serving, "gru", &gru_spec, &[(1, 1)], 12);
    streams_equal_solo(&serving, "tdnn", &tdnn_spec, &[], 12);
    // Each model's runner counts its own turns, labelled by its name.
    let metrics = http_get(&serving.addr, "/metrics");
    for name in ["gru", "tdnn"] {
        let turns = format!("tract_autobatch_turns_total{{runnable=\"{name}\"}}");
        assert!(
            metrics.lines().any(|l| l.starts_with(&turns)),
            "no {turns} in\n{metrics}"
        );
    }
}

/// The body of `GET path` from `addr` (empty where nothing answers).
pub fn http_get(addr: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(addr) else {
        return String::new();
    };
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
    let mut body = String::new();
    let _ = s.read_to_string(&mut body);
    body.split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default()
}

/// Silero twice in one process: the spec `laned check` prints for the
/// published ONNX (its facts, state pair and sample rate given on the
/// command line) and the built-in spec; 16 clients each, feeding 576
/// samples a pulse (their own context kept), every probability the
/// model's alone.
#[test]
fn silero_checked_and_built_in_is_served_exactly() {
    let Some(path) = or_skip("silero-vad", laned_models::silero::fetch()) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let path = path.to_string_lossy().into_owned();
    let args = [[path.as_str()].as_slice(), &super::SILERO_FACTS].concat();
    let checked = checked_spec(dir.path(), "checked.toml", &args);
    let builtin = dir.path().join("silero.toml");
    std::fs::write(&builtin, "[model]\nbuiltin = \"silero\"\n[runner]\nmax_lanes = 32\n").unwrap();
    let serving = serve(&[
        &format!("silero={}", checked.display()),
        &format!("vad={}", builtin.display()),
    ])
    .unwrap();
    // The state pair: input 2, output 1 ("state" in the built-in).
    streams_equal_solo(&serving, "silero", &checked, &[(2, 1)], 6);
    streams_equal_solo(&serving, "vad", &builtin, &[(2, 1)], 6);
}

/// Bad input: a frame of the wrong length and a text frame are closed
/// 1003 naming what was wanted, an unknown model is a 404 naming the
/// models, while another stream goes on exact; a model whose rows mix
/// keeps the server from starting, the reason named.
#[test]
fn bad_input_is_refused_by_name_and_touches_no_other_stream() {
    let dir = tempfile::tempdir().unwrap();
    let gru = save(&fixtures::gru_cell(8, 16).unwrap().model, dir.path(), "gru.nnef.tar");
    let spec = checked_spec(dir.path(), "gru.toml", &[&gru, "--state", "1=1"]);
    let serving = serve(&[&format!("gru={}", spec.display())]).unwrap();
    let url = format!("ws://{}/v1/models/gru/stream", serving.addr);
    let pulses = noise_pulses(7, 20, 32);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let good = tokio::spawn({
            let (url, pulses) = (url.clone(), pulses.clone());
            async move { client(&url, &pulses).await }
        });
        let (code, why) = refused(&url, Message::Binary(vec![0u8; 31].into())).await;
        assert_eq!(code, 1003, "{why}");
        assert!(why.contains("32") && why.contains("31"), "{why}");
        // One pulse is the largest frame: more is refused as too big.
        let (code, why) = refused(&url, Message::Binary(vec![0u8; 33].into())).await;
        assert_eq!(code, 1009, "{why}");
        assert!(why.contains("32-byte limit"), "{why}");
        let (code, why) = refused(&url, Message::Text("hello".into())).await;
        assert_eq!(code, 1003, "{why}");
        assert!(why.contains("binary"), "{why}");
        let nan: Vec<u8> = f32::NAN.to_le_bytes().repeat(8);
        let (_, answers) = client(&url, &[nan]).await;
        assert_eq!(answers.len(), 1);
        let (_, answers) = good.await.unwrap();
        assert_eq!(answers, solo(&spec, &[(1, 1)], &pulses), "the good stream was touched");
    });
    let unknown = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(tokio_tungstenite::connect_async(format!(
            "ws://{}/v1/models/nope/stream",
            serving.addr
        )));
    match unknown {
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => {
            assert_eq!(r.status(), 404);
            let body = String::from_utf8_lossy(r.body().as_deref().unwrap_or_default()).to_string();
            assert!(body.contains("\"nope\"") && body.contains("gru"), "{body}");
        }
        other => panic!("an unknown model: {other:?}"),
    }
    // A model that mixes its streams (a max over the batch broadcast
    // back): laned check refuses it, and so does laned serve.
    let mixing = save(&super::max_over_batch(), dir.path(), "max.nnef.tar");
    let spec = dir.path().join("max.toml");
    std::fs::write(&spec, format!("[model]\nfile = {mixing:?}\n")).unwrap();
    let why = serve(&[&format!("max={}", spec.display())]).err().unwrap();
    assert!(
        why.contains("cannot be laned") && why.contains("mixes the streams"),
        "{why}"
    );
}

/// A venv with this checkout's Python client installed (`pip install
/// clients/python`: the package `laned_client`, its command
/// `laned-client-py`, `websockets>=14` and `numpy`), made once per process
/// under the target's scratch folder. The registry is asked once, while
/// the venv lacks the dependencies; after that the package alone is
/// reinstalled from this checkout, offline. Its python, or `None` after
/// saying `SKIPPED` where Python or the registry is not to be had here (CI
/// fails on that word).
fn python() -> Option<PathBuf> {
    static PYTHON: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
    PYTHON.get_or_init(python_venv).clone()
}

/// This checkout's Python client, `clients/python`.
fn python_client_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../clients/python")
}

/// An exclusive lock on `path` (made if missing), held while the file
/// stays open: test processes that share a venv make it one at a time.
pub fn exclusive(path: &Path) -> std::fs::File {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::create(path).unwrap();
    // SAFETY: flock on a descriptor this function owns, open for the call.
    let locked = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
    assert_eq!(locked, 0, "locking {}", path.display());
    file
}

fn python_venv() -> Option<PathBuf> {
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join("python-client-venv");
    let _made_by_one = exclusive(&venv.with_extension("lock"));
    let bin = venv.join("bin/python");
    let package = python_client_dir();
    let runs = |code: &str| {
        Command::new(&bin)
            .args(["-c", code])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    // What building and running the package takes, websockets new enough
    // for `additional_headers`.
    let ready =
        runs("import setuptools, wheel, numpy, websockets; assert int(websockets.__version__.split('.')[0]) >= 14");
    if !ready && !bin.exists() {
        let made = Command::new("python3").args(["-m", "venv"]).arg(&venv).status();
        if !made.is_ok_and(|s| s.success()) {
            eprintln!("SKIPPED: no python3 with venv here to make {}", venv.display());
            return None;
        }
    }
    let pip = |args: &[&str]| {
        Command::new(venv.join("bin/pip"))
            .args(["install", "--quiet", "--disable-pip-version-check"])
            .args(args)
            .arg(&package)
            .status()
            .is_ok_and(|s| s.success())
    };
    // The package's sources as they stand (names, sizes, times): a venv
    // whose install matches is used as it is, so that one test process
    // never reinstalls under another's feet.
    let sources = {
        let mut files: Vec<String> = std::fs::read_dir(package.join("laned_client"))
            .into_iter()
            .flatten()
            .flatten()
            .chain(std::fs::read_dir(&package).into_iter().flatten().flatten())
            .filter_map(|e| {
                let m = e.metadata().ok().filter(|m| m.is_file())?;
                Some(format!("{} {} {:?}", e.path().display(), m.len(), m.modified().ok()))
            })
            .collect();
        files.sort();
        files.join("\n")
    };
    let stamp = venv.join("laned-client.stamp");
    if ready && std::fs::read_to_string(&stamp).is_ok_and(|s| s == sources) {
        return Some(bin);
    }
    let installed = if ready {
        pip(&["--no-index", "--no-deps", "--no-build-isolation", "--force-reinstall"])
    } else {
        pip(&["setuptools>=70.1", "wheel"])
    };
    let _ = std::fs::write(&stamp, &sources);
    if !installed || !runs("import laned_client") {
        eprintln!(
            "SKIPPED: pip could not install {} (websockets, numpy) into {}",
            package.display(),
            venv.display()
        );
        return None;
    }
    Some(bin)
}

/// The Python client's command (`laned-client-py`, installed by pip)
/// against a real `laned serve`: a raw file of pulses in, every answer out
/// equal to the model run alone, with binary answers and with JSON ones
/// (`python -m laned_client --format json`: the same bytes written); a
/// file that is not whole pulses exits 2, naming its length.
#[test]
fn the_python_client_gets_the_answers_of_the_model_alone() {
    let Some(python) = python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let gru = save(&fixtures::gru_cell(8, 16).unwrap().model, dir.path(), "gru.nnef.tar");
    let spec = checked_spec(dir.path(), "gru.toml", &[&gru, "--state", "1=1"]);
    let serving = serve(&[&format!("gru={}", spec.display())]).unwrap();
    let pulses = noise_pulses(11, 25, 32);
    let (src, dst) = (dir.path().join("in.raw"), dir.path().join("out.raw"));
    std::fs::write(&src, pulses.concat()).unwrap();
    let command = python.with_file_name("laned-client-py");
    let url = format!("ws://{}/v1/models/gru/stream", serving.addr);
    let want = solo(&spec, &[(1, 1)], &pulses).concat();
    let run = || Command::new(&command).arg(&url).args([&src, &dst]).output().unwrap();
    let out = run();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(std::fs::read(&dst).unwrap() == want, "the Python client's answers");
    std::fs::remove_file(&dst).unwrap();
    let out = Command::new(&python)
        .args(["-m", "laned_client"])
        .arg(&url)
        .args([&src, &dst])
        .args(["--format", "json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        std::fs::read(&dst).unwrap() == want,
        "the Python client's answers, JSON on the wire"
    );
    // A file that is not whole pulses is refused, exit 2, naming its length.
    std::fs::write(&src, vec![0u8; 33]).unwrap();
    let out = run();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("33 bytes"), "{}", text(&out));
}

/// The Python package's own checks (clients/python/tests/check_client.py)
/// against a real `laned serve`: both APIs (asyncio and blocking, a call
/// at a time and every pulse at once) answer as the model alone, byte for
/// byte; an unknown model raises `UnknownModel`; JSON answers equal binary
/// ones (a NaN pulse's too); a wrong shape is a `ValueError` naming the
/// input and both shapes.
#[test]
fn the_python_package_passes_its_checks_against_laned_serve() {
    let Some(python) = python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let gru = save(&fixtures::gru_cell(8, 16).unwrap().model, dir.path(), "gru.nnef.tar");
    let spec = checked_spec(dir.path(), "gru.toml", &[&gru, "--state", "1=1"]);
    let serving = serve(&[&format!("gru={}", spec.display())]).unwrap();
    let pulses = noise_pulses(13, 12, 32);
    let (src, want) = (dir.path().join("in.raw"), dir.path().join("want.raw"));
    std::fs::write(&src, pulses.concat()).unwrap();
    std::fs::write(&want, solo(&spec, &[(1, 1)], &pulses).concat()).unwrap();
    let out = Command::new(&python)
        .arg(python_client_dir().join("tests/check_client.py"))
        .arg(format!("ws://{}", serving.addr))
        .arg("gru")
        .args([&src, &want])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains(" passed, 0 failed"), "{}", text(&out));
}

/// The Python client's command where the server will not serve it: a close
/// before the hello (1013: the one lane held, none freed up within the
/// admission wait) exits 3, busy, as the 503 of a full connection cap does;
/// an unknown model (404) exits 5; an address where nothing listens exits 1
/// at once (a URL that never connected is not retried). Each is said in
/// one line on stderr, no traceback.
#[test]
fn the_python_client_says_busy_refused_and_unreachable_in_one_line() {
    let Some(python) = python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let gru = save(&fixtures::gru_cell(8, 16).unwrap().model, dir.path(), "gru.nnef.tar");
    let spec = checked_spec(dir.path(), "gru.toml", &[&gru, "--state", "1=1"]);
    // One lane: a stream holding it leaves none for the next.
    let mut one_lane = Spec::from_toml_file(&spec).unwrap();
    one_lane.runner.max_lanes = 1;
    std::fs::write(&spec, one_lane.to_toml().unwrap()).unwrap();
    let model = format!("gru={}", spec.display());
    let src = dir.path().join("in.raw");
    std::fs::write(&src, noise_pulses(17, 3, 32).concat()).unwrap();
    let command = python.with_file_name("laned-client-py");
    // The command on `url`: its exit status (`code`) and its one stderr line.
    let client = |url: &str, code: i32| -> String {
        let out = Command::new(&command)
            .arg(url)
            .arg(&src)
            .arg(dir.path().join("out.raw"))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(code), "{url}: {}", text(&out));
        assert_eq!(stderr.lines().count(), 1, "{url}: one line wanted:\n{stderr}");
        assert!(!stderr.contains("Traceback"), "{url}: {stderr}");
        stderr
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    // A stream admitted, its hello read and a pulse answered (a lane is
    // taken at the first call), left open: it holds a lane and a place.
    let hold = |url: &str| {
        runtime.block_on(async {
            let (mut ws, _) = tokio_tungstenite::connect_async(url).await.unwrap();
            let hello = ws.next().await;
            assert!(
                matches!(hello, Some(Ok(Message::Text(_)))),
                "{url}: {hello:?} where the hello was due"
            );
            ws.send(Message::Binary(vec![0u8; 32].into())).await.unwrap();
            let answer = ws.next().await;
            assert!(
                matches!(answer, Some(Ok(Message::Binary(_)))),
                "{url}: {answer:?} where the answer was due"
            );
            ws
        })
    };
    let waiting = serve(&[model.as_str(), "--admission-wait-ms", "200"]).unwrap();
    let url = format!("ws://{}/v1/models/gru/stream", waiting.addr);
    let holder = hold(&url);
    let said = client(&url, 3);
    assert!(said.contains("1013"), "{said}");
    let said = client(&format!("ws://{}/v1/models/nope/stream", waiting.addr), 5);
    assert!(said.contains("404") && said.contains("nope"), "{said}");
    drop(holder);
    let capped = serve(&[model.as_str(), "--max-connections", "1"]).unwrap();
    let url = format!("ws://{}/v1/models/gru/stream", capped.addr);
    let holder = hold(&url);
    let said = client(&url, 3);
    assert!(said.contains("503"), "{said}");
    drop(holder);
    // A port nobody listens on: refused at once, and not retried for the
    // 30 s resume window.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let started = std::time::Instant::now();
    let said = client(&format!("ws://127.0.0.1:{port}/v1/models/gru/stream"), 1);
    assert!(said.contains("no connection"), "{said}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(10),
        "an address that never answered was retried: {:?}",
        started.elapsed()
    );
}

/// Streams that have had [`GOING`] answers on one connection.
pub type Going = std::sync::Arc<std::sync::atomic::AtomicUsize>;

/// Answers a stream has had before a replica may be stopped under it.
pub const GOING: usize = 10;

/// Until `n` streams are going (bounded: 30 s).
pub async fn all_going(going: &Going, n: usize) {
    let until = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    while going.load(std::sync::atomic::Ordering::Relaxed) < n {
        assert!(tokio::time::Instant::now() < until, "the streams never got going");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// Sends `pulses` from the hello's `resume` on, each answered in turn, as
/// stream `id`, about one every 5 ms; stops at a close (its code and
/// reason) or a dropped connection (1006), returning the hello, the
/// answers and how it ended (`None`: every pulse answered).
pub async fn client_with_id(
    url: &str,
    id: &str,
    pulses: &[Vec<u8>],
    going: &Going,
) -> (serde_json::Value, Vec<Vec<u8>>, Option<(u16, String)>) {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let mut request = url.into_client_request().unwrap();
    request.headers_mut().insert("x-stream-id", id.parse().unwrap());
    let (mut ws, _) = tokio_tungstenite::connect_async(request).await.unwrap();
    let hello: serde_json::Value = match ws.next().await.unwrap().unwrap() {
        Message::Text(t) => serde_json::from_str(&t).unwrap(),
        other => panic!("{other:?}"),
    };
    let from = hello["resume"].as_u64().unwrap() as usize;
    let mut answers = Vec::new();
    for p in &pulses[from..] {
        if ws.send(Message::Binary(p.clone().into())).await.is_err() {
            return (hello, answers, Some((1006, "dropped".into())));
        }
        loop {
            match ws.next().await {
                Some(Ok(Message::Binary(b))) => {
                    answers.push(b.to_vec());
                    if answers.len() == GOING {
                        going.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    break;
                }
                Some(Ok(Message::Close(Some(f)))) => {
                    return (hello, answers, Some((f.code.into(), f.reason.to_string())))
                }
                Some(Ok(Message::Close(None))) | Some(Err(_)) | None => {
                    return (hello, answers, Some((1006, "dropped".into())))
                }
                Some(Ok(_)) => continue,
            }
        }
        // Real time, roughly: the drain has streams to hand over.
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let _ = ws.close(None).await;
    (hello, answers, None)
}

/// Two models on two `laned serve` replicas sharing a Redis: the first
/// replica is told SIGTERM mid-stream; each stream is handed over (1012,
/// its position named), resumes on the second from its record (the
/// hello's `resume`), and its answers, both replicas' together, are the
/// model's alone.
#[test]
fn a_restart_hands_every_stream_of_two_models_over() {
    let Some(redis) = Redis::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let big = save(&fixtures::gru_cell(8, 16).unwrap().model, dir.path(), "big.nnef.tar");
    let small = save(&fixtures::gru_cell(4, 8).unwrap().model, dir.path(), "small.nnef.tar");
    let big_spec = checked_spec(dir.path(), "big.toml", &[&big, "--state", "1=1"]);
    let small_spec = checked_spec(dir.path(), "small.toml", &[&small, "--state", "1=1"]);
    let models = [
        format!("big={}", big_spec.display()),
        format!("small={}", small_spec.display()),
    ];
    let args = |store: &str| -> Vec<String> {
        let mut a = models.to_vec();
        a.extend([
            "--store".into(),
            store.into(),
            "--drain-deadline-ms".into(),
            "5000".into(),
        ]);
        a
    };
    let first = serve(&args(&redis.url()).iter().map(String::as_str).collect::<Vec<_>>()).unwrap();
    let second = serve(&args(&redis.url()).iter().map(String::as_str).collect::<Vec<_>>()).unwrap();
    let streams: Vec<(&str, PathBuf, usize, Vec<Vec<u8>>)> = (0..8)
        .map(|s| {
            let (name, spec, bytes) = if s % 2 == 0 {
                ("big", &big_spec, 32)
            } else {
                ("small", &small_spec, 16)
            };
            (name, spec.clone(), s, noise_pulses(100 + s as u64, 200, bytes))
        })
        .collect();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let going = Going::default();
    let results = runtime.block_on(async {
        let tasks: Vec<_> = streams
            .iter()
            .map(|(name, _, s, pulses)| {
                let (a, b, going) = (first.addr.clone(), second.addr.clone(), going.clone());
                let (name, id, pulses) = (name.to_string(), format!("call-{s}"), pulses.clone());
                tokio::spawn(async move {
                    let url = |addr: &str| format!("ws://{addr}/v1/models/{name}/stream");
                    let (hello, mut answers, closed) = client_with_id(&url(&a), &id, &pulses, &going).await;
                    assert_eq!(hello["resume"], 0, "{hello}");
                    let (code, why) = closed.expect("the stream was not handed over");
                    assert_eq!(code, 1012, "{why}");
                    assert!(why.contains(&format!("resume at chunk {}", answers.len())), "{why}");
                    let (hello, more, closed) = client_with_id(&url(&b), &id, &pulses, &going).await;
                    assert_eq!(hello["resume"].as_u64(), Some(answers.len() as u64), "{hello}");
                    assert!(closed.is_none(), "{closed:?}");
                    answers.extend(more);
                    answers
                })
            })
            .collect();
        all_going(&going, streams.len()).await;
        first.terminate();
        let mut results = Vec::new();
        for t in tasks {
            results.push(t.await.unwrap());
        }
        results
    });
    for ((name, spec, s, pulses), answers) in streams.iter().zip(results) {
        let want = solo(spec, &[(1, 1)], pulses);
        assert_eq!(answers.len(), want.len(), "{name} stream {s}");
        assert!(
            answers == want,
            "{name} stream {s}: answers across the restart differ from the model alone"
        );
    }
}

/// A replica killed outright (SIGKILL) with checkpoints every 4 pulses:
/// every stream resumes on the other replica from its last checkpoint
/// (at most 4 pulses back, resent), and its answers are the model's alone.
#[test]
fn a_replica_killed_outright_loses_no_stream_with_checkpoints() {
    let Some(redis) = Redis::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let gru = save(&fixtures::gru_cell(8, 16).unwrap().model, dir.path(), "gru.nnef.tar");
    let spec = checked_spec(dir.path(), "gru.toml", &[&gru, "--state", "1=1"]);
    let model = format!("gru={}", spec.display());
    let args = [model.as_str(), "--store", &redis.url(), "--checkpoint-every", "4"];
    let mut first = serve(&args).unwrap();
    let second = serve(&args).unwrap();
    let streams: Vec<Vec<Vec<u8>>> = (0..6).map(|s| noise_pulses(300 + s, 200, 32)).collect();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let going = Going::default();
    let results = runtime.block_on(async {
        let tasks: Vec<_> = streams
            .iter()
            .enumerate()
            .map(|(s, pulses)| {
                let (a, b, going) = (first.addr.clone(), second.addr.clone(), going.clone());
                let pulses = pulses.clone();
                tokio::spawn(async move {
                    let (id, url) = (format!("kill-{s}"), |addr: &str| {
                        format!("ws://{addr}/v1/models/gru/stream")
                    });
                    let (_, mut answers, ended) = client_with_id(&url(&a), &id, &pulses, &going).await;
                    assert_eq!(ended.as_ref().map(|e| e.0), Some(1006), "{ended:?}");
                    let (hello, more, ended) = client_with_id(&url(&b), &id, &pulses, &going).await;
                    assert!(ended.is_none(), "{ended:?}");
                    let from = hello["resume"].as_u64().unwrap() as usize;
                    assert!(
                        from.is_multiple_of(4) && from <= answers.len() && answers.len() - from <= 4,
                        "resumed at {from} after {} answers",
                        answers.len()
                    );
                    answers.truncate(from);
                    answers.extend(more);
                    answers
                })
            })
            .collect();
        all_going(&going, streams.len()).await;
        let _ = first.child.kill();
        let mut results = Vec::new();
        for t in tasks {
            results.push(t.await.unwrap());
        }
        results
    });
    for (s, (pulses, answers)) in streams.iter().zip(results).enumerate() {
        assert!(
            answers == solo(&spec, &[(1, 1)], pulses),
            "stream {s}: answers across the kill differ from the model alone"
        );
    }
}

/// HAProxy (Debian's) on the shipped `deploy/haproxy/haproxy.cfg`, its
/// addresses pointed at `replicas`, killed when dropped; `None` after
/// `SKIPPED` where it is not installed.
struct Proxy {
    child: Child,
    addr: String,
    _dir: tempfile::TempDir,
}

impl Proxy {
    fn start(replicas: [&str; 2]) -> Option<Proxy> {
        if Command::new("haproxy").arg("-v").output().is_err() {
            eprintln!("SKIPPED: haproxy is not installed (Debian's `haproxy`; .ci/run installs it)");
            return None;
        }
        let front = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .to_string();
        let shipped =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/haproxy/haproxy.cfg")).unwrap();
        assert!(shipped.contains("127.0.0.1:9001") && shipped.contains("127.0.0.1:8000"));
        let cfg = shipped
            .replace("127.0.0.1:8000", &front)
            .replace("127.0.0.1:9001", replicas[0])
            .replace("127.0.0.1:9002", replicas[1]);
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("haproxy.cfg"), cfg).unwrap();
        let child = Command::new("haproxy")
            .arg("-db")
            .arg("-f")
            .arg(dir.path().join("haproxy.cfg"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let proxy = Proxy {
            child,
            addr: front,
            _dir: dir,
        };
        let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !http_get(&proxy.addr, "/ready").starts_with("model") {
            assert!(std::time::Instant::now() < until, "haproxy never forwarded /ready");
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        Some(proxy)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The path a user takes, end to end: two models checked, their specs
/// served by two replicas behind the shipped HAProxy with Redis, 8 `laned
/// client` processes (real time, a pulse every 5 ms) with stream ids; one
/// replica is told SIGTERM mid-stream: every client resumes through the
/// proxy, exits 0, and its answers are the model's alone.
#[test]
fn a_rolling_restart_behind_haproxy_loses_nothing_for_laned_client() {
    let Some(redis) = Redis::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let big = save(&fixtures::gru_cell(8, 16).unwrap().model, dir.path(), "big.nnef.tar");
    let small = save(&fixtures::gru_cell(4, 8).unwrap().model, dir.path(), "small.nnef.tar");
    let big_spec = checked_spec(dir.path(), "big.toml", &[&big, "--state", "1=1"]);
    let small_spec = checked_spec(dir.path(), "small.toml", &[&small, "--state", "1=1"]);
    let (big_arg, small_arg) = (
        format!("big={}", big_spec.display()),
        format!("small={}", small_spec.display()),
    );
    let url = redis.url();
    let args = [
        big_arg.as_str(),
        &small_arg,
        "--store",
        &url,
        "--drain-deadline-ms",
        "5000",
    ];
    let first = serve(&args).unwrap();
    let second = serve(&args).unwrap();
    let Some(proxy) = Proxy::start([&first.addr, &second.addr]) else {
        return;
    };
    let streams: Vec<(&str, &PathBuf, Vec<Vec<u8>>)> = (0..8)
        .map(|s| match s % 2 {
            0 => ("big", &big_spec, noise_pulses(500 + s, 300, 32)),
            _ => ("small", &small_spec, noise_pulses(500 + s, 300, 16)),
        })
        .collect();
    let clients: Vec<(Child, PathBuf)> = streams
        .iter()
        .enumerate()
        .map(|(s, (name, _, pulses))| {
            let (src, dst) = (
                dir.path().join(format!("in-{s}.raw")),
                dir.path().join(format!("out-{s}.raw")),
            );
            std::fs::write(&src, pulses.concat()).unwrap();
            let child = Command::new(env!("CARGO_BIN_EXE_laned"))
                .args(["client", &format!("ws://{}/v1/models/{name}/stream", proxy.addr)])
                .args([&src, &dst])
                .args([
                    "--stream",
                    &format!("rolling-{s}"),
                    "--every-ms",
                    "5",
                    "--resume-for-ms",
                    "20000",
                ])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            (child, dst)
        })
        .collect();
    // Every client streaming (a lane each, over both replicas) before the
    // first replica is told to stop.
    let taken = |addr: &str| -> usize {
        http_get(addr, "/ready")
            .lines()
            .filter_map(|l| l.split("lanes_free ").nth(1)?.split(' ').next()?.parse::<usize>().ok())
            .map(|free| 64 - free)
            .sum()
    };
    let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while taken(&first.addr) + taken(&second.addr) < streams.len() {
        assert!(std::time::Instant::now() < until, "the clients never all streamed");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    first.terminate();
    let mut resumed = 0;
    for ((child, dst), (s, (name, spec, pulses))) in clients.into_iter().zip(streams.iter().enumerate()) {
        let out = child.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{name} stream {s}: {}", text(&out));
        resumed += text(&out).contains("reconnecting") as usize;
        let got = std::fs::read(dst).unwrap();
        assert!(
            got == solo(spec, &[(1, 1)], pulses).concat(),
            "{name} stream {s}: answers differ from the model alone"
        );
    }
    // The hash put streams on both replicas: some were handed over.
    assert!(resumed > 0, "no client was handed over");
}

/// The DTLN chain served as a built-in (one f32 input of 128 samples):
/// 16 clients, then `laned client` on a WAV, every denoised pulse the
/// chain's alone; an input that is not whole pulses exits 2, an unknown
/// model 5.
#[test]
fn laned_client_feeds_a_wav_to_the_dtln_chain_exactly() {
    if or_skip("DTLN", laned_models::dtln::fetch()).is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("dtln.toml");
    std::fs::write(&spec, "[model]\nbuiltin = \"dtln-chain\"\n").unwrap();
    let serving = serve(&[&format!("dtln={}", spec.display())]).unwrap();
    let pairs = [(1, 1), (2, 2), (3, 3), (4, 4)];
    streams_equal_solo(&serving, "dtln", &spec, &pairs, 8);
    let url = format!("ws://{}/v1/models/dtln/stream", serving.addr);
    // 20 pulses and 50 samples: the last pulse padded with zeros.
    let samples: Vec<i16> = (0..128 * 20 + 50)
        .map(|k| ((k * 7919) % 20000) as i16 - 10000)
        .collect();
    let wav = dir.path().join("in.wav");
    let spec_wav = hound::WavSpec {
        channels: 1,
        sample_rate: 16000,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let mut writer = hound::WavWriter::create(&wav, spec_wav).unwrap();
    samples.iter().for_each(|s| writer.write_sample(*s).unwrap());
    writer.finalize().unwrap();
    let mut bytes: Vec<u8> = samples
        .iter()
        .flat_map(|s| (*s as f32 / 32768.0).to_le_bytes())
        .collect();
    bytes.resize(128 * 4 * 21, 0);
    let pulses: Vec<Vec<u8>> = bytes.chunks(512).map(<[u8]>::to_vec).collect();
    let out_path = dir.path().join("out.raw");
    let client = |url: &str, input: &Path| {
        Command::new(env!("CARGO_BIN_EXE_laned"))
            .args(["client", url])
            .args([input, &out_path])
            .output()
            .unwrap()
    };
    let out = client(&url, &wav);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        std::fs::read(&out_path).unwrap() == solo(&spec, &pairs, &pulses).concat(),
        "the denoised audio differs from the chain alone"
    );
    let odd = dir.path().join("odd.raw");
    std::fs::write(&odd, vec![0u8; 100]).unwrap();
    let out = client(&url, &odd);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("100 bytes"), "{}", text(&out));
    let out = client(&format!("ws://{}/v1/models/nope/stream", serving.addr), &odd);
    assert_eq!(out.status.code(), Some(5), "{}", text(&out));
    assert!(text(&out).contains("404"), "{}", text(&out));
}

/// A model both replicas serve: its name, spec and explicit state pairs,
/// the bytes of a pulse, and whether its whole state travels.
struct Served {
    name: &'static str,
    spec: PathBuf,
    pairs: Vec<(usize, usize)>,
    bytes: usize,
    travels: bool,
}

impl Served {
    fn new(name: &'static str, spec: PathBuf, pairs: Vec<(usize, usize)>, travels: bool) -> Served {
        let loaded = Spec::from_toml_file(&spec).unwrap().model.load().unwrap();
        let bytes = Interface::of(&loaded, &pairs).unwrap().pulse_bytes();
        Served {
            name,
            spec,
            pairs,
            bytes,
            travels,
        }
    }
}

/// The models whose state lives in tract's pulsified ops, checked where a
/// test writes them: a conv stack (its Delay buffers), a GRU as tract
/// streams it (a Scan), and the DeepFilterNet3 built-in (both, and its
/// glue's explicit state). `None` where DeepFilterNet3 cannot be fetched.
fn pulsified_models(dir: &Path) -> Option<Vec<Served>> {
    or_skip("DeepFilterNet3", laned_models::dfn::fetch())?;
    let config = TdnnConfig {
        width: 8,
        pulse: 4,
        layout: Layout::Nchw,
    };
    let tdnn = save(&fixtures::tdnn_streaming(config).unwrap(), dir, "tdnn.nnef.tar");
    let gru = save(&fixtures::gru_scan_streaming(6, 5).unwrap(), dir, "gru-scan.nnef.tar");
    let dfn = dir.join("dfn.toml");
    std::fs::write(&dfn, "[model]\nbuiltin = \"deepfilternet3\"\n").unwrap();
    Some(vec![
        Served::new(
            "tdnn",
            checked_spec(dir, "tdnn.toml", &[&tdnn, "--pulse", "4"]),
            vec![],
            true,
        ),
        Served::new(
            "gru",
            checked_spec(dir, "gru.toml", &[&gru, "--pulse", "2"]),
            vec![],
            true,
        ),
        Served::new("dfn", dfn, (1..=5).map(|i| (i, i)).collect(), true),
    ])
}

/// `models` on two replicas sharing a Redis, two streams each; the first
/// replica is stopped mid-stream (SIGTERM, or SIGKILL with checkpoints
/// every 4 pulses). Every stream resumes on the second where it is told:
/// where its state travels, at the position handed over (SIGTERM: named
/// in the 1012) or its last checkpoint (SIGKILL); where it does not, at 0,
/// the 1012 saying so. Its answers, both replicas' together, are the
/// model's alone.
fn restart_resumes_exactly(models: &[Served], kill: bool) {
    let Some(redis) = Redis::start() else { return };
    let mut args: Vec<String> = models
        .iter()
        .map(|m| format!("{}={}", m.name, m.spec.display()))
        .collect();
    args.extend([
        "--store".into(),
        redis.url(),
        "--drain-deadline-ms".into(),
        "5000".into(),
    ]);
    if kill {
        args.extend(["--checkpoint-every".into(), "4".into()]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut first = serve(&args).unwrap();
    let second = serve(&args).unwrap();
    let streams: Vec<(usize, usize, Vec<Vec<u8>>)> = (0..models.len() * 2)
        .map(|s| {
            (
                s % models.len(),
                s,
                noise_pulses(700 + s as u64, 80, models[s % models.len()].bytes),
            )
        })
        .collect();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let going = Going::default();
    let results = runtime.block_on(async {
        let tasks: Vec<_> = streams
            .iter()
            .map(|(m, s, pulses)| {
                let (a, b, going) = (first.addr.clone(), second.addr.clone(), going.clone());
                let (name, travels) = (models[*m].name, models[*m].travels);
                let (id, pulses) = (format!("{}-{s}-{kill}", name), pulses.clone());
                tokio::spawn(async move {
                    let url = |addr: &str| format!("ws://{addr}/v1/models/{name}/stream");
                    let (hello, mut answers, ended) = client_with_id(&url(&a), &id, &pulses, &going).await;
                    assert_eq!(hello["resume"], 0, "{hello}");
                    let (code, why) = ended.expect("the stream was not stopped");
                    if kill {
                        assert_eq!(code, 1006, "{name}: {why}");
                    } else {
                        assert_eq!(code, 1012, "{name}: {why}");
                        let told = if travels { answers.len() } else { 0 };
                        assert!(why.contains(&format!("resume at chunk {told}")), "{name}: {why}");
                        assert_eq!(why.contains("does not travel"), !travels, "{name}: {why}");
                    }
                    let (hello, more, ended) = client_with_id(&url(&b), &id, &pulses, &going).await;
                    assert!(ended.is_none(), "{name}: {ended:?}");
                    let from = hello["resume"].as_u64().unwrap() as usize;
                    match (travels, kill) {
                        (false, _) => assert_eq!(from, 0, "{name}: {hello}"),
                        (true, false) => assert_eq!(from, answers.len(), "{name}: {hello}"),
                        // A checkpoint's position, not past what was
                        // answered; one due while the last is still being
                        // written is dropped (off the answer path), so under
                        // load the last may be two or more behind.
                        (true, true) => assert!(
                            from.is_multiple_of(4) && from <= answers.len() && (answers.len() < 8 || from >= 4),
                            "{name}: resumed at {from} after {} answers",
                            answers.len()
                        ),
                    }
                    answers.truncate(from);
                    answers.extend(more);
                    answers
                })
            })
            .collect();
        all_going(&going, streams.len()).await;
        if kill {
            let _ = first.child.kill();
        } else {
            first.terminate();
        }
        let mut results = Vec::new();
        for t in tasks {
            results.push(t.await.unwrap());
        }
        results
    });
    for ((m, s, pulses), answers) in streams.iter().zip(results) {
        let model = &models[*m];
        assert!(
            answers == solo(&model.spec, &model.pairs, pulses),
            "{} stream {s}: answers across the {} differ from the model alone",
            model.name,
            if kill { "kill" } else { "restart" }
        );
    }
}

/// A rolling restart (SIGTERM) of a conv stack, a GRU as tract streams it
/// and DeepFilterNet3: their ops' state travels with each stream, which
/// resumes exactly where it is told.
#[test]
fn a_restart_hands_pulsified_models_over_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let Some(models) = pulsified_models(dir.path()) else {
        return;
    };
    restart_resumes_exactly(&models, false);
}

/// A replica of the same three killed outright, checkpoints every 4
/// pulses: each stream resumes from its last checkpoint, exactly.
#[test]
fn a_kill_resumes_pulsified_models_from_their_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let Some(models) = pulsified_models(dir.path()) else {
        return;
    };
    restart_resumes_exactly(&models, true);
}

/// A conv with edge padding keeps its last frame inside tract's op, which
/// cannot be read out: `laned check` says it cannot hand over, and on a
/// restart its streams are told to start again at 0 (never a position
/// whose state is lost), on a kill they start at 0; beside it, a model that
/// travels resumes where it was.
#[test]
fn a_model_whose_state_stays_restarts_at_zero_said_so() {
    let dir = tempfile::tempdir().unwrap();
    let edge = save(&fixtures::edge_pad_streaming().unwrap(), dir.path(), "edge.nnef.tar");
    let out = laned(&["check", &edge, "--pulse", "4"]);
    assert!(text(&out).contains("hand-over: not possible"), "{}", text(&out));
    assert!(text(&out).contains("does not travel"), "{}", text(&out));
    let edge_spec = checked_spec(dir.path(), "edge.toml", &[&edge, "--pulse", "4"]);
    let gru = save(
        &fixtures::gru_scan_streaming(6, 5).unwrap(),
        dir.path(),
        "gru-scan.nnef.tar",
    );
    let gru_spec = checked_spec(dir.path(), "gru.toml", &[&gru, "--pulse", "2"]);
    let models = [
        Served::new("edge", edge_spec, vec![], false),
        Served::new("gru", gru_spec, vec![], true),
    ];
    restart_resumes_exactly(&models, false);
    restart_resumes_exactly(&models, true);
}

/// DeepFilterNet3 served as a built-in: `laned client` on a 48 kHz WAV of
/// noisy speech (espeak-ng, seeded noise) writes the denoised audio, every
/// pulse the model's alone (its ops' state inside tract's state, its
/// glue's fed back by hand from its initial values).
#[test]
fn laned_client_denoises_a_wav_through_deepfilternet3_exactly() {
    if or_skip("DeepFilterNet3", laned_models::dfn::fetch()).is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("dfn.toml");
    std::fs::write(&spec, "[model]\nbuiltin = \"deepfilternet3\"\n").unwrap();
    let serving = serve(&[&format!("dfn={}", spec.display())]).unwrap();
    let speech = laned_models::sound::speak_at("a denoised hello", 48_000).expect("espeak-ng speaks");
    let noise = laned_models::sound::samples(laned_models::sound::Sound::Noise, 9, speech.len());
    let samples: Vec<i16> = speech
        .iter()
        .zip(&noise)
        .map(|(s, n)| ((s + 0.05 * n).clamp(-1.0, 1.0) * 32767.0) as i16)
        .collect();
    let wav = dir.path().join("noisy.wav");
    let wav_spec = hound::WavSpec {
        channels: 1,
        sample_rate: 48_000,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let mut writer = hound::WavWriter::create(&wav, wav_spec).unwrap();
    samples.iter().for_each(|s| writer.write_sample(*s).unwrap());
    writer.finalize().unwrap();
    let mut bytes: Vec<u8> = samples
        .iter()
        .flat_map(|s| (*s as f32 / 32768.0).to_le_bytes())
        .collect();
    bytes.resize(bytes.len().div_ceil(1920) * 1920, 0);
    let pulses: Vec<Vec<u8>> = bytes.chunks(1920).map(<[u8]>::to_vec).collect();
    let out_path = dir.path().join("denoised.raw");
    let url = format!("ws://{}/v1/models/dfn/stream", serving.addr);
    let out = Command::new(env!("CARGO_BIN_EXE_laned"))
        .args(["client", &url])
        .args([&wav, &out_path])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let pairs: Vec<(usize, usize)> = (1..=5).map(|i| (i, i)).collect();
    let got = std::fs::read(&out_path).unwrap();
    assert_eq!(got.len(), bytes.len(), "one denoised pulse a pulse");
    assert!(
        got == solo(&spec, &pairs, &pulses).concat(),
        "the denoised audio differs from DeepFilterNet3 alone"
    );
}
