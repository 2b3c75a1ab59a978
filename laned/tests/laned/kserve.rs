//! Triton's own HTTP client (`tritonclient.http`, from PyPI, in a venv
//! made here) against `laned serve`'s KServe v2 front, unchanged but for
//! the URL: sequences interleaved one request a pulse, every answer the
//! model alone, bit for bit; bad requests each refused by name beside
//! them; a rolling restart of two replicas sharing a Redis mid-sequence,
//! every sequence resumed on the other replica, exact.

use std::path::{Path, PathBuf};
use std::process::Command;

use laned_testkit::fixtures;

use super::serve::{checked_spec, noise_pulses, serve, solo, Serving};
use super::{free_port, save};
use laned_server::testing::Redis;

/// A venv with `tritonclient[http,grpc]` and numpy, made once under the
/// target's scratch folder; its python, or `None` after saying `SKIPPED`
/// (CI fails on that word).
fn triton_python() -> Option<PathBuf> {
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join("tritonclient-venv");
    // Test processes run side by side: one makes the venv, the others wait.
    let _made_by_one = super::serve::exclusive(&venv.with_extension("lock"));
    let bin = venv.join("bin/python");
    let ready = || {
        Command::new(&bin)
            .args(["-c", "import tritonclient.http, tritonclient.grpc, numpy"])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if ready() {
        return Some(bin);
    }
    let made = Command::new("python3").args(["-m", "venv"]).arg(&venv).status();
    let installed = made.is_ok_and(|s| s.success())
        && Command::new(venv.join("bin/pip"))
            .args([
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "tritonclient[http,grpc]",
                "numpy",
            ])
            .status()
            .is_ok_and(|s| s.success());
    if !installed || !ready() {
        eprintln!(
            "SKIPPED: pip could not install tritonclient[http,grpc] into {}",
            venv.display()
        );
        return None;
    }
    Some(bin)
}

/// The GRU the tests write (8 in, 16 hidden, its state a pair), checked.
fn gru(dir: &Path) -> PathBuf {
    let model = save(&fixtures::gru_cell(8, 16).unwrap().model, dir, "gru.nnef.tar");
    checked_spec(dir, "gru.toml", &[&model, "--state", "1=1"])
}

/// The check script's input: the pulses and the model's own answers
/// written, the spec file's path.
fn script_input(dir: &Path, spec: &Path, url: &str, (sequences, pulses): (usize, usize)) -> serde_json::Value {
    let streams: Vec<Vec<Vec<u8>>> = (0..sequences)
        .map(|s| noise_pulses(300 + s as u64, pulses, 32))
        .collect();
    let answers: Vec<u8> = streams.iter().flat_map(|p| solo(spec, &[(1, 1)], p).concat()).collect();
    let pulses_file = dir.join("pulses.raw");
    let answers_file = dir.join("answers.raw");
    std::fs::write(&pulses_file, streams.concat().concat()).unwrap();
    std::fs::write(&answers_file, answers).unwrap();
    serde_json::json!({
        "url": url,
        "model": "gru",
        "input": "input",
        "output": "output",
        "in_shape": [1, 8],
        "sequences": sequences,
        "pulses": pulses,
        "pulses_file": pulses_file,
        "answers_file": answers_file,
    })
}

/// The input and output names the served GRU has, from its v2 metadata.
fn names(serving: &Serving) -> (String, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(&serving.addr).unwrap();
    write!(s, "GET /v2/models/gru HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
    let mut said = String::new();
    s.read_to_string(&mut said).unwrap();
    let body = said.split_once("\r\n\r\n").unwrap().1;
    let meta: serde_json::Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {said}"));
    assert_eq!(meta["inputs"][0]["shape"], serde_json::json!([-1, 8]), "{meta}");
    assert_eq!(meta["inputs"][0]["datatype"], "FP32", "{meta}");
    (
        meta["inputs"][0]["name"].as_str().unwrap().to_string(),
        meta["outputs"][0]["name"].as_str().unwrap().to_string(),
    )
}

fn run_script(python: &Path, dir: &Path, input: &serde_json::Value, script: &str) -> String {
    let file = dir.join("check.json");
    std::fs::write(&file, input.to_string()).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/laned").join(script);
    let out = Command::new(python).arg(script).arg(&file).output().unwrap();
    let said = super::text(&out);
    assert_eq!(out.status.code(), Some(0), "{said}");
    said
}

/// Sixteen sequences (numbered and named) interleaved through
/// `tritonclient.http`, a third as JSON, the rest binary; seven bad
/// requests beside them (a wrong datatype, shape, input name or model, no
/// `sequence_start`, a second start, a body past the limit), each refused
/// naming what was wrong; two sequences fed the same pulses get the same
/// bits. Then two replicas sharing a Redis, replica A stopped (SIGTERM)
/// after 4 of 10 pulses of 8 sequences: each resumes on B from the record
/// A handed over, every answer the model alone.
#[test]
fn tritonclient_http_drives_sequences_exactly_and_across_a_restart() {
    let Some(python) = triton_python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let spec = gru(dir.path());
    let serving = serve(&[&format!("gru={}", spec.display())]).unwrap();
    let (input, output) = names(&serving);
    let mut check = script_input(dir.path(), &spec, &serving.addr, (16, 6));
    check["input"] = input.clone().into();
    check["output"] = output.clone().into();
    let said = run_script(&python, dir.path(), &check, "triton_http.py");
    assert!(said.contains("16 sequences of 6 pulses exact"), "{said}");
    drop(serving);

    let Some(redis) = Redis::start() else { return };
    let args = |url: &str| vec![format!("gru={}", spec.display()), "--store".into(), url.to_string()];
    let a = serve(&args(&redis.url()).iter().map(String::as_str).collect::<Vec<_>>()).unwrap();
    let b = serve(&args(&redis.url()).iter().map(String::as_str).collect::<Vec<_>>()).unwrap();
    let mut check = script_input(dir.path(), &spec, &a.addr, (8, 10));
    check["input"] = input.into();
    check["output"] = output.into();
    check["restart"] = serde_json::json!({ "pid": a.pid(), "after": 4, "other": b.addr });
    let said = run_script(&python, dir.path(), &check, "triton_http.py");
    assert!(said.contains("every one resumed on B"), "{said}");
}

/// `tritonclient.grpc` on `laned serve --grpc-listen`: 16 sequences
/// multiplexed on one `ModelStreamInfer` stream (every pulse sent at once,
/// numbered and named ids), then 16 connections of one sequence each,
/// interleaved; every answer the model alone; twins equal; bad requests
/// refused by name. Then two replicas sharing a Redis, 8 sequences on one
/// stream to replica A, A stopped (SIGTERM) after 4 of 10 rounds: each
/// sequence resumes on B's stream from the record A handed over, exact.
#[test]
fn tritonclient_grpc_multiplexes_sequences_exactly_and_across_a_restart() {
    let Some(python) = triton_python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let spec = gru(dir.path());
    let grpc = format!("127.0.0.1:{}", free_port());
    let serving = serve(&[&format!("gru={}", spec.display()), "--grpc-listen", &grpc]).unwrap();
    let (input, output) = names(&serving);
    let mut check = script_input(dir.path(), &spec, &grpc, (16, 6));
    check["input"] = input.clone().into();
    check["output"] = output.clone().into();
    let said = run_script(&python, dir.path(), &check, "triton_grpc.py");
    assert!(said.contains("16 sequences of 6 pulses exact on one stream"), "{said}");
    drop(serving);

    let Some(redis) = Redis::start() else { return };
    let (grpc_a, grpc_b) = (
        format!("127.0.0.1:{}", free_port()),
        format!("127.0.0.1:{}", free_port()),
    );
    let args = |url: &str, at: &str| {
        vec![
            format!("gru={}", spec.display()),
            "--store".into(),
            url.to_string(),
            "--grpc-listen".into(),
            at.to_string(),
        ]
    };
    let a = serve(
        &args(&redis.url(), &grpc_a)
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    )
    .unwrap();
    let _b = serve(
        &args(&redis.url(), &grpc_b)
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    )
    .unwrap();
    let mut check = script_input(dir.path(), &spec, &grpc_a, (8, 10));
    check["input"] = input.into();
    check["output"] = output.into();
    check["restart"] = serde_json::json!({ "pid": a.pid(), "after": 4, "other": grpc_b });
    let said = run_script(&python, dir.path(), &check, "triton_grpc.py");
    assert!(said.contains("every one resumed on B"), "{said}");
}

/// Model `model`'s first input's and output's names and its input's shape
/// for one sequence (the batch axis 1), from its v2 metadata.
fn metadata(addr: &str, model: &str) -> (String, String, Vec<usize>) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET /v2/models/{model} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut said = String::new();
    s.read_to_string(&mut said).unwrap();
    let body = said.split_once("\r\n\r\n").unwrap().1;
    let meta: serde_json::Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {said}"));
    assert_eq!(meta["inputs"][0]["shape"][0], -1, "{meta}");
    let shape = meta["inputs"][0]["shape"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_i64().unwrap().max(1) as usize)
        .collect();
    (
        meta["inputs"][0]["name"].as_str().unwrap().to_string(),
        meta["outputs"][0]["name"].as_str().unwrap().to_string(),
        shape,
    )
}

/// A served model: its name, spec file and state pairs.
type Model = (&'static str, PathBuf, Vec<(usize, usize)>);

/// A pulsified conv stack the test writes (its Delay buffers the
/// runner's lanes) and Silero (its state an explicit pair, its sample rate
/// filled), served (with `extra` flags); each model's name, spec and pairs.
fn conv_and_silero(dir: &Path, extra: &[&str]) -> Option<(Serving, Vec<Model>)> {
    laned_models::fetch::or_skip("silero-vad", laned_models::silero::fetch())?;
    let config = fixtures::TdnnConfig {
        width: 8,
        pulse: 4,
        layout: fixtures::Layout::Nchw,
    };
    let tdnn = save(&fixtures::tdnn_streaming(config).unwrap(), dir, "tdnn.nnef.tar");
    let tdnn_spec = checked_spec(dir, "tdnn.toml", &[&tdnn, "--pulse", "4"]);
    let vad_spec = dir.join("vad.toml");
    std::fs::write(&vad_spec, "[model]\nbuiltin = \"silero\"\n").unwrap();
    let models = [
        format!("tdnn={}", tdnn_spec.display()),
        format!("vad={}", vad_spec.display()),
    ];
    let args: Vec<&str> = models.iter().map(String::as_str).chain(extra.iter().copied()).collect();
    let serving = serve(&args).unwrap();
    Some((
        serving,
        vec![("tdnn", tdnn_spec, vec![]), ("vad", vad_spec, vec![(2, 1)])],
    ))
}

/// The check script's input for model `model` served at `url` (its
/// metadata read at `http`): 16 sequences of 6 pulses of noise, the model's
/// own answers written.
fn model_input(
    dir: &Path,
    (http, url): (&str, &str),
    (model, spec, pairs): (&str, &Path, &[(usize, usize)]),
) -> serde_json::Value {
    let (input, output, shape) = metadata(http, model);
    let bytes = shape.iter().product::<usize>() * 4;
    let (sequences, pulses) = (16, 6);
    let streams: Vec<Vec<Vec<u8>>> = (0..sequences)
        .map(|s| noise_pulses(500 + s as u64, pulses, bytes))
        .collect();
    let answers: Vec<u8> = streams.iter().flat_map(|p| solo(spec, pairs, p).concat()).collect();
    let (pulses_file, answers_file) = (dir.join("pulses.raw"), dir.join("answers.raw"));
    std::fs::write(&pulses_file, streams.concat().concat()).unwrap();
    std::fs::write(&answers_file, answers).unwrap();
    serde_json::json!({
        "url": url, "model": model, "input": input, "output": output, "in_shape": shape,
        "sequences": sequences, "pulses": pulses,
        "pulses_file": pulses_file, "answers_file": answers_file,
    })
}

/// The pulsified conv and Silero through `tritonclient.http`: 16
/// sequences each interleaved, a third as JSON, every answer the model
/// alone; the bad requests beside them.
#[test]
fn tritonclient_http_drives_a_pulsified_conv_and_silero_exactly() {
    let Some(python) = triton_python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let Some((serving, models)) = conv_and_silero(dir.path(), &[]) else {
        return;
    };
    for (model, spec, pairs) in &models {
        let check = model_input(dir.path(), (&serving.addr, &serving.addr), (model, spec, pairs));
        let said = run_script(&python, dir.path(), &check, "triton_http.py");
        assert!(said.contains("16 sequences of 6 pulses exact"), "{model}: {said}");
    }
}

/// The pulsified conv and Silero through `tritonclient.grpc`: 16
/// sequences multiplexed on one stream and 16 connections of one sequence
/// each, interleaved pulse by pulse; every answer the model alone, the
/// stream's and the connection's of the same pulses the same bits; twins
/// equal; the bad requests refused by name.
#[test]
fn tritonclient_grpc_drives_a_pulsified_conv_and_silero_exactly() {
    let Some(python) = triton_python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let grpc = format!("127.0.0.1:{}", free_port());
    let Some((serving, models)) = conv_and_silero(dir.path(), &["--grpc-listen", &grpc]) else {
        return;
    };
    for (model, spec, pairs) in &models {
        let check = model_input(dir.path(), (&serving.addr, &grpc), (model, spec, pairs));
        let said = run_script(&python, dir.path(), &check, "triton_grpc.py");
        assert!(
            said.contains("16 sequences of 6 pulses exact on one stream and on 16 connections"),
            "{model}: {said}"
        );
    }
}

/// gRPC connections hold places under `max_connections` (4 here) as live
/// sessions do: the checker's own connection and 3 of one sequence each
/// fill them; one more gRPC connection is refused UNAVAILABLE naming the
/// cap, an HTTP request 503; the sequences stay exact; a place freed by a
/// close is served again.
#[test]
fn grpc_connections_count_under_the_connection_cap() {
    let Some(python) = triton_python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let spec = gru(dir.path());
    let grpc = format!("127.0.0.1:{}", free_port());
    let serving = serve(&[
        &format!("gru={}", spec.display()),
        "--grpc-listen",
        &grpc,
        "--max-connections",
        "4",
    ])
    .unwrap();
    let (input, output) = names(&serving);
    let mut check = script_input(dir.path(), &spec, &grpc, (3, 6));
    check["input"] = input.into();
    check["output"] = output.into();
    check["cap"] = serde_json::json!({ "places": 4, "http": serving.addr });
    let said = run_script(&python, dir.path(), &check, "triton_grpc.py");
    assert!(
        said.contains("3 connections at the cap of 4 exact; one more refused UNAVAILABLE, HTTP 503"),
        "{said}"
    );
}

/// One connection's streams hold at most
/// `MAX_SEQUENCES_PER_CONNECTION` (256) sequences: 256 live on one stream
/// (256 lanes), one more refused naming the bound, the 256 exact through
/// their 3 pulses; once they ended, a new one is taken.
#[test]
fn a_grpc_connection_holds_at_most_256_sequences() {
    let Some(python) = triton_python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let spec = gru(dir.path());
    let mut lanes = laned_models::spec::Spec::from_toml_file(&spec).unwrap();
    lanes.runner.max_lanes = 256;
    std::fs::write(&spec, lanes.to_toml().unwrap()).unwrap();
    let grpc = format!("127.0.0.1:{}", free_port());
    let serving = serve(&[&format!("gru={}", spec.display()), "--grpc-listen", &grpc]).unwrap();
    let (input, output) = names(&serving);
    let mut check = script_input(dir.path(), &spec, &grpc, (257, 3));
    check["input"] = input.into();
    check["output"] = output.into();
    check["bound"] = 256.into();
    let said = run_script(&python, dir.path(), &check, "triton_grpc.py");
    assert!(
        said.contains("256 sequences on one connection's stream exact"),
        "{said}"
    );
}

/// A gRPC connection that sends nothing for `idle_ms` is closed, its place
/// freed: with one place (`--max-connections 1`), an idle connection is
/// closed after 300 ms (not before), and a client then gets the place.
#[test]
fn an_idle_grpc_connection_is_closed_at_idle_ms() {
    use std::io::Read;
    let dir = tempfile::tempdir().unwrap();
    let spec = gru(dir.path());
    let grpc = format!("127.0.0.1:{}", free_port());
    let _serving = serve(&[
        &format!("gru={}", spec.display()),
        "--grpc-listen",
        &grpc,
        "--max-connections",
        "1",
        "--idle-ms",
        "300",
    ])
    .unwrap();
    let mut idle = std::net::TcpStream::connect(&grpc).unwrap();
    idle.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
    let since = std::time::Instant::now();
    let mut said = vec![];
    let ended = idle.read_to_end(&mut said);
    let after = since.elapsed();
    assert!(ended.is_ok(), "not closed within 10 s: {ended:?}");
    assert!(
        after >= std::time::Duration::from_millis(250) && after < std::time::Duration::from_secs(5),
        "closed after {after:?}"
    );
    // Its place freed: the next connection is served, not refused.
    let Some(python) = triton_python() else { return };
    let probe =
        "import sys, tritonclient.grpc as g; print(g.InferenceServerClient(url=sys.argv[1]).is_model_ready('gru'))";
    let out = Command::new(python).args(["-c", probe, &grpc]).output().unwrap();
    let said = super::text(&out);
    assert!(out.status.success() && said.contains("True"), "{said}");
}

/// Issue 68's attacks, each a case of `triton_attacks.py` against the
/// tests' GRU served with `extra` flags: what the script printed.
fn attack(case: &str, extra: &[&str], sequences_pulses: (usize, usize)) -> Option<String> {
    let python = triton_python()?;
    let dir = tempfile::tempdir().unwrap();
    let spec = gru(dir.path());
    let grpc = format!("127.0.0.1:{}", free_port());
    let model = format!("gru={}", spec.display());
    let args: Vec<&str> = [model.as_str(), "--grpc-listen", &grpc]
        .into_iter()
        .chain(extra.iter().copied())
        .collect();
    let serving = serve(&args).unwrap();
    let (input, output) = names(&serving);
    let mut check = script_input(dir.path(), &spec, &grpc, sequences_pulses);
    check["input"] = input.into();
    check["output"] = output.into();
    check["case"] = case.into();
    check["http"] = serving.addr.clone().into();
    check["pid"] = serving.pid().into();
    Some(run_script(&python, dir.path(), &check, "triton_attacks.py"))
}

/// Issue 68 row 5: a gRPC request of a live sequence asking for an
/// unknown output is refused INVALID_ARGUMENT before the model runs: the
/// same pulse sent again is the sequence's next, exact (it was applied
/// twice when the outputs were checked after the call).
#[test]
fn a_grpc_request_is_checked_whole_before_the_model_runs() {
    let Some(said) = attack("validate", &[], (1, 4)) else {
        return;
    };
    assert!(said.contains("an unknown output refused before the call"), "{said}");
}

/// One HTTP/1.1 request to `addr` (`Connection: close`): the status and
/// the body.
fn http(addr: &str, method: &str, path: &str, body: &[u8]) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(30))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .unwrap();
    s.write_all(body).unwrap();
    let mut said = vec![];
    s.read_to_end(&mut said).unwrap();
    let said = String::from_utf8_lossy(&said).into_owned();
    let status = said
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status: {said:?}"));
    let body = said
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

/// A GRU sequence driven over the REST front, one request a pulse, each
/// answer checked against the model alone.
struct RestSequence {
    input: String,
    output: String,
    pulses: Vec<Vec<u8>>,
    answers: Vec<Vec<u8>>,
}

impl RestSequence {
    fn new(serving: &Serving, spec: &Path, seed: u64, count: usize) -> RestSequence {
        let (input, output) = names(serving);
        let pulses = noise_pulses(seed, count, 32);
        let answers = solo(spec, &[(1, 1)], &pulses);
        RestSequence {
            input,
            output,
            pulses,
            answers,
        }
    }

    /// Pulse `p` of sequence `id` (a JSON number or string) sent to `addr`:
    /// the status and the answer's JSON.
    fn send(&self, addr: &str, id: serde_json::Value, p: usize, start: bool) -> (u16, serde_json::Value) {
        let data: Vec<f32> = self.pulses[p]
            .chunks(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        let body = serde_json::json!({
            "parameters": { "sequence_id": id, "sequence_start": start },
            "inputs": [{ "name": self.input, "datatype": "FP32", "shape": [1, 8], "data": data }],
        });
        let (status, said) = http(addr, "POST", "/v2/models/gru/infer", body.to_string().as_bytes());
        let json = serde_json::from_str(&said).unwrap_or_else(|e| panic!("{e}: {said}"));
        (status, json)
    }

    /// Whether `answer` is pulse `p`'s, bit for bit.
    fn exact(&self, answer: &serde_json::Value, p: usize) -> bool {
        let outputs = answer["outputs"].as_array().cloned().unwrap_or_default();
        let Some(o) = outputs.iter().find(|o| o["name"] == self.output.as_str()) else {
            return false;
        };
        let got: Vec<u8> = o["data"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|v| (v.as_f64().unwrap() as f32).to_le_bytes())
            .collect();
        got == self.answers[p]
    }

    /// Pulses `range` of `id` sent to `addr`, each answered exactly.
    fn run(&self, addr: &str, id: serde_json::Value, range: std::ops::Range<usize>, start: bool) {
        for p in range.clone() {
            let (status, answer) = self.send(addr, id.clone(), p, start && p == range.start);
            assert_eq!(status, 200, "pulse {p}: {answer}");
            assert!(
                self.exact(&answer, p),
                "pulse {p}: not the model's own answer: {answer}"
            );
        }
    }
}

/// Issue 68 row 4: a sequence continued without `sequence_start` on a
/// replica that does not hold it is refused by name (restart it with
/// `sequence_start`) unless its record is known current, never continued
/// from an older checkpoint. (a) Reaped after `idle_ms` with its last
/// checkpoint 2 pulses behind; (b) its replica killed (kill -9) 2 pulses
/// after its last checkpoint, the 7th sent to another. Each was answered
/// 200 from the checkpoint's state before. After a refusal, a restart
/// with `sequence_start` is exact.
#[test]
fn a_sequence_whose_saved_state_is_behind_its_last_answer_is_refused() {
    let Some(redis) = Redis::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let spec = gru(dir.path());
    let model = format!("gru={}", spec.display());
    let url = redis.url();
    let args = [
        model.as_str(),
        "--store",
        &url,
        "--checkpoint-every",
        "4",
        "--idle-ms",
        "500",
    ];
    let a = serve(&args).unwrap();
    let seq = RestSequence::new(&a, &spec, 68, 8);
    let stale = |status: u16, answer: &serde_json::Value| {
        let why = answer["error"].as_str().unwrap_or_default();
        status == 400 && why.contains("restart it with sequence_start") && why.contains("not held here")
    };
    // (a) Reaped: 6 pulses, the checkpoint at 4, then idle past idle_ms
    // (the reaper looks every second).
    seq.run(&a.addr, 17.into(), 0..6, true);
    std::thread::sleep(std::time::Duration::from_millis(2500));
    let (status, answer) = seq.send(&a.addr, 17.into(), 6, false);
    assert!(stale(status, &answer), "reaped, continued: {status} {answer}");
    seq.run(&a.addr, 17.into(), 0..3, true);
    // (b) Killed: another id, 6 pulses on A, A killed outright, the 7th
    // to B.
    let b = serve(&args).unwrap();
    seq.run(&a.addr, 18.into(), 0..6, true);
    drop(a);
    let (status, answer) = seq.send(&b.addr, 18.into(), 6, false);
    assert!(stale(status, &answer), "killed, continued elsewhere: {status} {answer}");
    seq.run(&b.addr, 18.into(), 0..8, true);
}

/// A record handed over on a drain is current: the sequence continues on
/// another replica exactly, once. Continued there, it is no longer
/// current: that replica killed, a third refuses the next pulse by name
/// (it was continued from the first replica's record, 200, wrong). And a
/// sequence started afresh over a handed-over record leaves it behind:
/// reaped, it is refused, not continued from the old record.
#[test]
fn a_handed_over_record_continues_a_sequence_once() {
    let Some(redis) = Redis::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let spec = gru(dir.path());
    let model = format!("gru={}", spec.display());
    let url = redis.url();
    let args = [model.as_str(), "--store", &url, "--idle-ms", "500"];
    let mut a = serve(&args).unwrap();
    let b = serve(&args).unwrap();
    let seq = RestSequence::new(&a, &spec, 69, 9);
    seq.run(&a.addr, 21.into(), 0..4, true);
    seq.run(&a.addr, "twice".into(), 0..4, true);
    a.terminate();
    assert!(a.exited_within(std::time::Duration::from_secs(20)), "A did not drain");
    // Continued on B from A's hand-over, exact.
    seq.run(&b.addr, 21.into(), 4..6, false);
    drop(b);
    let c = serve(&args).unwrap();
    let (status, answer) = seq.send(&c.addr, 21.into(), 6, false);
    let why = answer["error"].as_str().unwrap_or_default().to_string();
    assert!(
        status == 400 && why.contains("restart it with sequence_start"),
        "continued from a record already continued: {status} {answer}"
    );
    // Started afresh on C over A's record of "twice", 2 pulses, reaped:
    // not continued from A's record.
    seq.run(&c.addr, "twice".into(), 0..2, true);
    std::thread::sleep(std::time::Duration::from_millis(2500));
    let (status, answer) = seq.send(&c.addr, "twice".into(), 2, false);
    assert_eq!(
        status, 400,
        "a restarted sequence continued from an older record: {answer}"
    );
}

/// Sequence ids are Triton's: the number 17 and the string "17" are two
/// sequences (they were one: "17" continued 17, and starting "17" while
/// 17 lived was refused "started twice"). Both live side by side, each
/// exact.
#[test]
fn sequence_id_17_and_string_17_are_two_sequences() {
    let dir = tempfile::tempdir().unwrap();
    let spec = gru(dir.path());
    let serving = serve(&[&format!("gru={}", spec.display())]).unwrap();
    let seq = RestSequence::new(&serving, &spec, 70, 4);
    seq.run(&serving.addr, 17.into(), 0..2, true);
    let (status, answer) = seq.send(&serving.addr, "17".into(), 2, false);
    assert_eq!(status, 400, "\"17\" continued 17: {answer}");
    assert!(answer["error"].as_str().unwrap().contains("never started"), "{answer}");
    seq.run(&serving.addr, "17".into(), 0..4, true);
    seq.run(&serving.addr, 17.into(), 2..4, false);
}

/// An HTTP/2 frame: its length, kind, flags, stream and payload.
fn h2_frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let n = payload.len() as u32;
    let mut f = vec![(n >> 16) as u8, (n >> 8) as u8, n as u8, kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// The next HTTP/2 frame read: kind, flags, stream, payload.
fn h2_read(s: &mut std::net::TcpStream) -> std::io::Result<(u8, u8, u32, Vec<u8>)> {
    use std::io::Read;
    let mut head = [0u8; 9];
    s.read_exact(&mut head)?;
    let n = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
    let mut payload = vec![0u8; n];
    s.read_exact(&mut payload)?;
    let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
    Ok((head[3], head[4], stream, payload))
}

/// Issue 68 row 3: one connection opening 200 `ModelStreamInfer` streams,
/// headers only (HPACK written here by hand): the server announces
/// `SETTINGS_MAX_CONCURRENT_STREAMS` 128 (`grpc_max_streams`' default) and
/// refuses each stream past it `REFUSED_STREAM`; it took them all before,
/// about 16 KB each.
#[test]
fn a_grpc_connection_opens_at_most_grpc_max_streams_streams() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let spec = gru(dir.path());
    let grpc = format!("127.0.0.1:{}", free_port());
    let _serving = serve(&[&format!("gru={}", spec.display()), "--grpc-listen", &grpc]).unwrap();
    let mut s = std::net::TcpStream::connect(&grpc).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
    s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").unwrap();
    s.write_all(&h2_frame(4, 0, 0, &[])).unwrap();
    let (kind, _, _, settings) = h2_read(&mut s).unwrap();
    assert_eq!(kind, 4, "the server's first frame is its SETTINGS");
    let max_streams = settings
        .chunks(6)
        .find(|e| u16::from_be_bytes([e[0], e[1]]) == 3)
        .map(|e| u32::from_be_bytes([e[2], e[3], e[4], e[5]]));
    s.write_all(&h2_frame(4, 1, 0, &[])).unwrap();
    let path = b"/inference.GRPCInferenceService/ModelStreamInfer";
    let mut block = vec![0x83, 0x86, 0x04, path.len() as u8];
    block.extend_from_slice(path);
    block.extend_from_slice(&[0x01, 0x01, b'x', 0x0f, 0x10, 16]);
    block.extend_from_slice(b"application/grpc");
    block.extend_from_slice(&[0x00, 2]);
    block.extend_from_slice(b"te");
    block.push(8);
    block.extend_from_slice(b"trailers");
    let opened = 200u32;
    let frames: Vec<u8> = (0..opened).flat_map(|k| h2_frame(1, 0x4, 2 * k + 1, &block)).collect();
    s.write_all(&frames).unwrap();
    let mut refused = std::collections::BTreeSet::new();
    while refused.len() < (opened - 128) as usize {
        match h2_read(&mut s) {
            // RST_STREAM, REFUSED_STREAM (7).
            Ok((3, _, stream, code)) if code == [0, 0, 0, 7] => {
                refused.insert(stream);
            }
            Ok((7, _, _, goaway)) => panic!("GOAWAY: {goaway:?}"),
            Ok(_) => {}
            Err(e) => panic!("{} streams refused, then {e}", refused.len()),
        }
    }
    assert_eq!(max_streams, Some(128), "the server's SETTINGS: {settings:?}");
    assert_eq!(
        refused.iter().copied().collect::<Vec<_>>(),
        (128..opened).map(|k| 2 * k + 1).collect::<Vec<_>>(),
        "the streams refused"
    );
}

/// The tests' GRU on one lane (its spec rewritten): what the bounds'
/// attacks hold.
fn one_lane(dir: &Path) -> PathBuf {
    let spec = gru(dir);
    let mut lanes = laned_models::spec::Spec::from_toml_file(&spec).unwrap();
    lanes.runner.max_lanes = 1;
    lanes.runner.shards = Some(1);
    std::fs::write(&spec, lanes.to_toml().unwrap()).unwrap();
    spec
}

/// Issue 68's bounds: a case of `triton_attacks.py` against the one-lane
/// GRU, `server` the config's `[server]` table (besides `grpc_listen`).
fn bounded_attack(case: &str, server: &str, sequences_pulses: (usize, usize), bound: usize) -> Option<String> {
    let python = triton_python()?;
    let dir = tempfile::tempdir().unwrap();
    let spec = one_lane(dir.path());
    let grpc = format!("127.0.0.1:{}", free_port());
    let config = dir.path().join("serve.toml");
    std::fs::write(
        &config,
        format!("[server]\n{server}\n[models]\ngru = {:?}\n", spec.display().to_string()),
    )
    .unwrap();
    let config = config.display().to_string();
    let serving = serve(&[
        "--config",
        &config,
        "--grpc-listen",
        &grpc,
        "--admission-wait-ms",
        "60000",
    ])
    .unwrap();
    let (input, output) = names(&serving);
    let mut check = script_input(dir.path(), &spec, &grpc, sequences_pulses);
    check["input"] = input.into();
    check["output"] = output.into();
    check["case"] = case.into();
    check["bound"] = bound.into();
    Some(run_script(&python, dir.path(), &check, "triton_attacks.py"))
}

/// Issue 68 row 1: requests of no sequence on a stream, past
/// `grpc_max_requests` (8 here) in flight on the connection, are refused
/// RESOURCE_EXHAUSTED naming the bound at once (each used to be kept, a
/// task each, without end); the 8 under it are answered exactly once the
/// lane they wait for frees.
#[test]
fn grpc_requests_in_flight_on_a_connection_are_bounded() {
    let Some(said) = bounded_attack("requests", "grpc_max_requests = 8", (12, 2), 8) else {
        return;
    };
    assert!(said.contains("4 of 12 refused naming grpc_max_requests (8)"), "{said}");
}

/// Issue 68 row 2: a sequence ended on a stream but not yet served still
/// counts among the connection's 256: with every sequence waiting for the
/// lane, the 257th, all of them started and ended by their one request,
/// is refused naming the bound (ended sequences left the count, their
/// queues kept, without end).
#[test]
fn grpc_sequences_ended_but_not_served_count_under_the_bound() {
    let Some(said) = bounded_attack("ended", "grpc_max_requests = 1000", (257, 2), 256) else {
        return;
    };
    assert!(
        said.contains("the sequence past 256 refused naming the bound"),
        "{said}"
    );
}

/// On SIGTERM a gRPC stream with a live sequence is told `restarting`
/// (UNAVAILABLE) before the process exits (it was cut: "Stream
/// removed").
#[test]
fn on_sigterm_a_grpc_stream_is_told_restarting() {
    let Some(said) = attack("sigterm", &["--drain-deadline-ms", "1000"], (1, 2)) else {
        return;
    };
    assert!(
        said.contains("sigterm: the stream told") && said.contains("restarting"),
        "{said}"
    );
}

/// On SIGTERM a REST request reaching the server until its listener
/// closes is answered 503 `restarting` (the listener closed at the
/// drain's end, the process still closing its connections: connection
/// refused). An idle connection keeps the server closing for up to 3 s.
#[test]
fn on_sigterm_a_rest_request_is_told_restarting_until_the_listener_closes() {
    let dir = tempfile::tempdir().unwrap();
    let spec = gru(dir.path());
    let mut serving = serve(&[&format!("gru={}", spec.display())]).unwrap();
    let seq = RestSequence::new(&serving, &spec, 71, 2);
    // Requests of no sequence (id 0): no lane is held between them, so
    // the drain's wait ends at once.
    let (status, answer) = seq.send(&serving.addr, 0.into(), 0, false);
    assert!(status == 200 && seq.exact(&answer, 0), "{status} {answer}");
    let _idle = std::net::TcpStream::connect(&serving.addr).unwrap();
    serving.terminate();
    // Past the drain's wait, in its close (held open by the idle
    // connection for up to 3 s).
    std::thread::sleep(std::time::Duration::from_millis(500));
    let said = std::panic::catch_unwind(|| seq.send(&serving.addr, 0.into(), 1, false));
    let (status, answer) = said.unwrap_or_else(|_| panic!("no answer during the drain"));
    assert_eq!(status, 503, "{answer}");
    assert!(answer["error"].as_str().unwrap().contains("restarting"), "{answer}");
    assert!(
        serving.exited_within(std::time::Duration::from_secs(20)),
        "the server did not exit"
    );
}

/// The extensions' script (`triton_extensions.py`) in `mode` against a
/// GRU served over HTTP and gRPC: what it printed.
fn extensions(mode: &str, sequences_pulses: (usize, usize)) -> Option<String> {
    let python = triton_python()?;
    let dir = tempfile::tempdir().unwrap();
    let spec = gru(dir.path());
    let grpc = format!("127.0.0.1:{}", free_port());
    let serving = serve(&[&format!("gru={}", spec.display()), "--grpc-listen", &grpc]).unwrap();
    let (input, output) = names(&serving);
    let mut check = script_input(dir.path(), &spec, &grpc, sequences_pulses);
    check["input"] = input.into();
    check["output"] = output.into();
    check["mode"] = mode.into();
    check["http"] = serving.addr.clone().into();
    check["grpc"] = grpc.into();
    check["extensions"] = serde_json::json!(["sequence", "statistics", "model_repository", "system_shared_memory"]);
    Some(run_script(&python, dir.path(), &check, "triton_extensions.py"))
}

/// Issue 68, `statistics`: requests good and bad (a wrong shape) over
/// HTTP, then gRPC, read back with `get_inference_statistics` over both
/// fronts (every model's and the GRU's): success and fail the requests
/// sent, each part counted once a success, durations above 0, the parts
/// within the whole; an unknown model's refused by name.
#[test]
fn statistics_add_up_to_the_requests_sent_over_both_fronts() {
    let Some(said) = extensions("stats", (1, 4)) else {
        return;
    };
    assert!(
        said.contains("statistics add up over HTTP and gRPC: 8 successes, 4 failures"),
        "{said}"
    );
}

/// Issue 68, `model_repository`: the index over HTTP and gRPC lists the
/// served GRU, version 1, READY; its load is a no-op, another model's
/// load and any unload refused by name; the server metadata lists the
/// extensions served.
#[test]
fn the_repository_lists_the_served_model_and_refuses_changes_by_name() {
    let Some(said) = extensions("repository", (1, 1)) else {
        return;
    };
    assert!(said.contains("repository: index, load and unload as served"), "{said}");
}

/// Issue 68, `system_shared_memory`: regions made with
/// `tritonclient.utils.shared_memory`, one registered over each front;
/// 16 sequences interleaved, half over HTTP, half over gRPC, each pulse's
/// input read from a region at the sequence's offset and its answer
/// written into another, every answer the model alone; each bad region
/// refused over both fronts by name (an offset or size past the file's
/// end, an unknown key, a duplicate name, CUDA, an unknown region, an
/// input or output past its region's end, a byte size not the tensor's);
/// a region unregistered is gone and refused at use. As Triton (and so
/// perf_analyzer's `--shared-memory system`, whose C++ client reads any
/// `parameters` of an output as its binary data's): an HTTP answer's
/// output in shared memory has neither data nor parameters, and
/// unregistering CUDA regions, none registered, is done over both fronts.
#[test]
fn sixteen_sequences_run_exact_through_shared_memory_and_bad_regions_are_refused() {
    let Some(said) = extensions("shm", (16, 5)) else { return };
    assert!(
        said.contains("16 sequences of 5 pulses exact through shared memory; every bad region refused"),
        "{said}"
    );
}
