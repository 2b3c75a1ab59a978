//! Settings the server cannot serve with are refused at start, naming the
//! setting, before any model is fetched or loaded; `/metrics` says its
//! exposition format.

use crate::common::*;

use std::process::Command;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// `vad-server` with `args` and a model path that does not exist: a bad
/// setting must be refused (exit 2, naming it) before the model is looked
/// at (which would exit 1).
fn refused(args: &[&str], names: &str) {
    let out = Command::new(env!("CARGO_BIN_EXE_vad-server"))
        .args(["--listen", "127.0.0.1:0", "--model", "/nonexistent/silero.onnx"])
        .args(args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
    assert!(stderr.contains(names), "{args:?}: {stderr}");
    assert!(
        !stderr.contains("nonexistent"),
        "{args:?}: the model was looked at first: {stderr}"
    );
}

/// Zero lanes, zero shards, a frame limit that holds no sample, a zero
/// idle time, an unknown policy: each refused before the model.
#[test]
fn impossible_settings_are_refused_before_the_model() {
    refused(&["--lanes", "0"], "lanes is 0");
    refused(&["--shards", "0"], "shards is 0");
    refused(&["--max-frame-bytes", "0"], "max_frame_bytes is 0");
    refused(&["--max-frame-bytes", "3"], "max_frame_bytes is 3");
    refused(&["--idle-ms", "0"], "idle_ms is 0");
    refused(&["--policy", "soon"], "unknown policy");
    refused(&["--store", "http://127.0.0.1:1/"], "not a Redis URL");
    refused(&["--handover-ttl-s", "0"], "handover_ttl_s is 0");
    refused(&["--store-timeout-ms", "0"], "store_timeout_ms is 0");
    refused(&["--model-sha256", "abc"], "model_sha256");
}

/// A `--model` file whose SHA-256 is not the one given is refused (exit
/// 1, both digests named); `--fetch-model` prints the checked path and
/// exits 0 without serving.
#[test]
fn silero_the_model_file_is_checked_against_its_sha256() {
    let Some(model) = model_path() else { return };
    let pin = laned_models::silero::PIN.sha256;
    let run = |sha: &str| {
        Command::new(env!("CARGO_BIN_EXE_vad-server"))
            .args([
                "--listen",
                "127.0.0.1:0",
                "--fetch-model",
                "--model-sha256",
                sha,
                "--model",
            ])
            .arg(&model)
            .output()
            .unwrap()
    };
    let out = run(pin);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), model.display().to_string());
    let wrong = "0".repeat(64);
    let out = run(&wrong);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(pin) && stderr.contains(&wrong), "{stderr}");
}

/// `/metrics` is served as Prometheus' text format, version 0.0.4.
#[test]
fn silero_metrics_say_their_exposition_format() {
    let Some(plan) = plan() else { return };
    bounded(30, async {
        let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
            .build_recorder()
            .handle();
        let settings = laned_server::Settings {
            limits: laned_server::Limits {
                listen: "127.0.0.1:0".parse().unwrap(),
                ..laned_server::Limits::default()
            },
            ..laned_server::Settings::default()
        };
        let server = laned_server::start(plan.clone(), settings, Some(handle)).await.unwrap();
        let mut s = tokio::net::TcpStream::connect(server.addr).await.unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await.unwrap();
        let text = String::from_utf8_lossy(&buf).to_lowercase();
        let head = text.split("\r\n\r\n").next().unwrap();
        assert!(head.starts_with("http/1.1 200"), "{head}");
        assert!(
            head.contains("content-type: text/plain; version=0.0.4; charset=utf-8"),
            "{head}"
        );
        server.shutdown().await;
    });
}
