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

/// A pulsified conv stack the test writes (its Delay buffers the runner's
/// lanes) and Silero (its state an explicit pair, its sample rate filled),
/// through `tritonclient.http`: 16 sequences each interleaved, a third as
/// JSON, every answer the model alone; the bad requests beside them.
#[test]
fn tritonclient_http_drives_a_pulsified_conv_and_silero_exactly() {
    let Some(python) = triton_python() else { return };
    if laned_models::fetch::or_skip("silero-vad", laned_models::silero::fetch()).is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let config = fixtures::TdnnConfig {
        width: 8,
        pulse: 4,
        layout: fixtures::Layout::Nchw,
    };
    let tdnn = save(&fixtures::tdnn_streaming(config).unwrap(), dir.path(), "tdnn.nnef.tar");
    let tdnn_spec = checked_spec(dir.path(), "tdnn.toml", &[&tdnn, "--pulse", "4"]);
    let vad_spec = dir.path().join("vad.toml");
    std::fs::write(&vad_spec, "[model]\nbuiltin = \"silero\"\n").unwrap();
    let serving = serve(&[
        &format!("tdnn={}", tdnn_spec.display()),
        &format!("vad={}", vad_spec.display()),
    ])
    .unwrap();
    for (model, spec, pairs) in [("tdnn", &tdnn_spec, vec![]), ("vad", &vad_spec, vec![(2, 1)])] {
        let (input, output, shape) = metadata(&serving.addr, model);
        let bytes = shape.iter().product::<usize>() * 4;
        let (sequences, pulses) = (16, 6);
        let streams: Vec<Vec<Vec<u8>>> = (0..sequences)
            .map(|s| noise_pulses(500 + s as u64, pulses, bytes))
            .collect();
        let answers: Vec<u8> = streams.iter().flat_map(|p| solo(spec, &pairs, p).concat()).collect();
        let (pulses_file, answers_file) = (dir.path().join("pulses.raw"), dir.path().join("answers.raw"));
        std::fs::write(&pulses_file, streams.concat().concat()).unwrap();
        std::fs::write(&answers_file, answers).unwrap();
        let check = serde_json::json!({
            "url": serving.addr, "model": model, "input": input, "output": output, "in_shape": shape,
            "sequences": sequences, "pulses": pulses,
            "pulses_file": pulses_file, "answers_file": answers_file,
        });
        let said = run_script(&python, dir.path(), &check, "triton_http.py");
        assert!(said.contains("16 sequences of 6 pulses exact"), "{model}: {said}");
    }
}
