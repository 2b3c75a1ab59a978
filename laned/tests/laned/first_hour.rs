//! The first hour with `laned serve`, as a newcomer spends it: a spec
//! written by `laned check` from a relative path, a WAV cut as the model's
//! spec says, JSON answers that keep NaN and the infinities, one model
//! full while the others stay ready, a wrong URL, the built-ins fetched
//! ahead of time. Each test failed before its fix.

use std::path::Path;
use std::process::Command;

use futures_util::{SinkExt, StreamExt};
use laned_models::fetch::or_skip;
use laned_models::spec::AudioFraming;
use laned_testkit::fixtures;
use tokio_tungstenite::tungstenite::Message;
use tract_core::internal::*;

use super::serve::{client, serve, solo};
use super::{free_port, laned, save, text};

/// `GET path` on `addr`: the status and the body.
fn get(addr: &str, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(addr) else {
        return (0, String::new());
    };
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
    let mut said = String::new();
    let _ = s.read_to_string(&mut said);
    let status = said.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = said
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

/// `laned check`'s spec, printed in a folder.
fn spec_checked_in(cwd: &Path, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_laned"))
        .arg("check")
        .args(args)
        .current_dir(cwd)
        .output()
        .unwrap();
    let said = text(&out);
    assert_eq!(out.status.code(), Some(0), "{said}");
    said.split("(TOML):").nth(1).unwrap().trim().to_string()
}

/// `laned check models/gru.nnef.tar > models/gru.toml`, run from the
/// project's folder: the spec is served from any working directory (the
/// path was written as typed and read against the spec's folder:
/// `models/models/gru.nnef.tar`, not found).
#[test]
fn a_spec_checked_from_a_relative_path_is_served_from_anywhere() {
    let dir = tempfile::tempdir().unwrap();
    let models = dir.path().join("models");
    std::fs::create_dir(&models).unwrap();
    save(&fixtures::gru_cell(4, 8).unwrap().model, &models, "gru.nnef.tar");
    let spec = spec_checked_in(dir.path(), &["models/gru.nnef.tar", "--state", "1=1"]);
    let path = models.join("gru.toml");
    std::fs::write(&path, &spec).unwrap();
    let serving = serve(&[&format!("gru={}", path.display())]).unwrap_or_else(|e| panic!("{e}\n{spec}"));
    let pulses = super::serve::noise_pulses(3, 4, 16);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let url = format!("ws://{}/v1/models/gru/stream", serving.addr);
    let (_, got) = runtime.block_on(client(&url, &pulses));
    assert_eq!(got, solo(&path, &[(1, 1)], &pulses));
}

/// A model that doubles its input: NaN, and each infinity, stay themselves.
fn doubler() -> TypedModel {
    let mut model = TypedModel::default();
    let b = model.symbols.sym("B");
    let x = model.add_source("x", f32::fact(dims!(b, 4))).unwrap();
    let two = model.add_const("two", tensor2(&[[2f32; 4]])).unwrap();
    let y = model.wire_node("y", tract_core::ops::math::mul(), &[x, two]).unwrap();
    model.select_output_outlets(&y).unwrap();
    model
}

/// `?format=json` answers: finite values numbers, NaN and the infinities
/// the strings "NaN", "Infinity", "-Infinity" (serde_json wrote `null` for
/// all three, one indistinguishable value).
#[test]
fn json_answers_keep_nan_and_the_infinities_apart() {
    let dir = tempfile::tempdir().unwrap();
    let model = save(&doubler(), dir.path(), "double.nnef.tar");
    let spec = spec_checked_in(dir.path(), &[&model]);
    let path = dir.path().join("double.toml");
    std::fs::write(&path, &spec).unwrap();
    let serving = serve(&[&format!("double={}", path.display())]).unwrap();
    let url = format!("ws://{}/v1/models/double/stream?format=json", serving.addr);
    let pulse: Vec<u8> = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1.25]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    let answer = tokio::runtime::Runtime::new().unwrap().block_on(async {
        let (mut ws, _) = tokio_tungstenite::connect_async(&url).await.unwrap();
        let _hello = ws.next().await.unwrap().unwrap();
        ws.send(Message::Binary(pulse.clone().into())).await.unwrap();
        loop {
            match ws.next().await.unwrap().unwrap() {
                Message::Text(t) => break serde_json::from_str::<serde_json::Value>(&t).unwrap(),
                Message::Ping(_) | Message::Pong(_) => continue,
                other => panic!("{other:?} where a JSON answer was due"),
            }
        }
    });
    assert_eq!(
        answer,
        serde_json::json!({"pulse": 0, "outputs": [["NaN", "Infinity", "-Infinity", 2.5]]})
    );
    // `laned client` on the JSON URL writes each answer's line (it skipped
    // text frames and waited for the idle close).
    let input = dir.path().join("in.raw");
    let output = dir.path().join("out.jsonl");
    std::fs::write(&input, [pulse.clone(), pulse].concat()).unwrap();
    let out = laned(&["client", &url, input.to_str().unwrap(), output.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&output)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[1]["pulse"], 1);
    assert_eq!(lines[1]["outputs"], answer["outputs"]);
}

/// A 16-bit mono WAV of `samples` at `rate`.
fn wav(path: &Path, samples: &[i16], rate: u32) {
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate: rate,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let mut writer = hound::WavWriter::create(path, spec).unwrap();
    samples.iter().for_each(|s| writer.write_sample(*s).unwrap());
    writer.finalize().unwrap();
}

/// A WAV through `laned client` to the Silero built-in is cut as Silero
/// is fed (64 samples of context, then 512 new ones; the hello says so),
/// every probability the model's alone on those pulses; a WAV at 8 kHz is
/// refused naming both rates (it was cut into back-to-back 576-sample
/// blocks, rate unchecked: wrong probabilities, no error).
#[test]
fn laned_client_cuts_a_wav_as_the_model_says_and_checks_its_rate() {
    if or_skip("silero-vad", laned_models::silero::fetch()).is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("silero.toml");
    std::fs::write(&spec, "[model]\nbuiltin = \"silero\"\n").unwrap();
    let serving = serve(&[&format!("vad={}", spec.display())]).unwrap();
    let url = format!("ws://{}/v1/models/vad/stream", serving.addr);
    let (hello, _) = tokio::runtime::Runtime::new().unwrap().block_on(client(&url, &[]));
    assert_eq!(
        hello["audio"],
        serde_json::json!({"sample_rate": 16000, "hop": 512, "context": 64}),
        "{hello}"
    );
    let samples: Vec<i16> = laned_models::sound::samples(laned_models::sound::Sound::Noise, 4, 512 * 9 + 100)
        .iter()
        .map(|s| (s * 12000.0) as i16)
        .collect();
    let input = dir.path().join("in.wav");
    wav(&input, &samples, 16_000);
    let floats: Vec<f32> = samples.iter().map(|s| *s as f32 / 32768.0).collect();
    let framing = laned_models::silero::AUDIO;
    let pulses: Vec<Vec<u8>> = framing
        .pulses(&floats)
        .iter()
        .map(|p| p.iter().flat_map(|x| x.to_le_bytes()).collect())
        .collect();
    assert_eq!(pulses.len(), 10);
    let out_path = dir.path().join("out.raw");
    let out = laned(&["client", &url, input.to_str().unwrap(), out_path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let got = std::fs::read(&out_path).unwrap();
    assert!(
        got == solo(&spec, &[(2, 1)], &pulses).concat(),
        "the probabilities differ from Silero fed its own framing"
    );
    // The same cut a back-to-back one would not be: the check sees it.
    let back_to_back = AudioFraming {
        context: 0,
        hop: 576,
        ..framing
    };
    let wrong: Vec<Vec<u8>> = back_to_back
        .pulses(&floats)
        .iter()
        .map(|p| p.iter().flat_map(|x| x.to_le_bytes()).collect())
        .collect();
    assert_ne!(got, solo(&spec, &[(2, 1)], &wrong).concat());
    let slow = dir.path().join("8k.wav");
    wav(&slow, &samples, 8_000);
    let out = laned(&["client", &url, slow.to_str().unwrap(), out_path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("8000 Hz") && text(&out).contains("16000 Hz"),
        "{}",
        text(&out)
    );
}

/// Two models, one of one lane held by a stream (and no spawner allowed to
/// wait): that model's readiness is 503, on the main and the probe
/// address, while `/ready` stays 200 for the other (it was 503 for the
/// whole replica).
#[test]
fn a_full_model_pulls_only_itself_out_of_readiness() {
    let dir = tempfile::tempdir().unwrap();
    let gru = save(&fixtures::gru_cell(4, 8).unwrap().model, dir.path(), "gru.nnef.tar");
    let spec = spec_checked_in(dir.path(), &[&gru, "--state", "1=1"]);
    let roomy = dir.path().join("roomy.toml");
    std::fs::write(&roomy, &spec).unwrap();
    let mut one: laned_models::spec::Spec = toml::from_str(&spec).unwrap();
    one.runner.max_lanes = 1;
    one.runner.max_waiting = 0;
    let full = dir.path().join("full.toml");
    std::fs::write(&full, one.to_toml().unwrap()).unwrap();
    let probes = format!("127.0.0.1:{}", free_port());
    let serving = serve(&[
        &format!("roomy={}", roomy.display()),
        &format!("full={}", full.display()),
        "--probe-listen",
        &probes,
    ])
    .unwrap();
    let url = format!("ws://{}/v1/models/full/stream", serving.addr);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let _held = runtime.block_on(async {
        let (mut ws, _) = tokio_tungstenite::connect_async(&url).await.unwrap();
        let _hello = ws.next().await.unwrap().unwrap();
        ws.send(Message::Binary(vec![0u8; 16].into())).await.unwrap();
        let answer = ws.next().await.unwrap().unwrap();
        assert!(matches!(answer, Message::Binary(_)), "{answer:?}");
        ws
    });
    for at in [serving.addr.as_str(), probes.as_str()] {
        let (code, body) = get(at, "/v1/models/full/ready");
        assert_eq!(code, 503, "{at}: {body}");
        assert!(body.contains("lanes_free 0"), "{at}: {body}");
        assert_eq!(get(at, "/v1/models/roomy/ready").0, 200, "{at}");
        let (code, body) = get(at, "/ready");
        assert_eq!(code, 200, "{at}: one model full pulled the replica: {body}");
        assert_eq!(get(at, "/v1/models/nope/ready").0, 404, "{at}");
    }
}

/// `laned client` on a URL nobody serves says so once and exits 1 (it
/// retried for 30 s, a line every 100 ms); its default stream id is not
/// made from the pid and the clock.
#[test]
fn laned_client_on_a_wrong_url_exits_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.raw");
    std::fs::write(&input, [0u8; 16]).unwrap();
    let url = format!("ws://127.0.0.1:{}/v1/models/gru/stream", free_port());
    let out = laned(&[
        "client",
        &url,
        input.to_str().unwrap(),
        dir.path().join("out.raw").to_str().unwrap(),
    ]);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("cannot connect"), "{said}");
    assert!(!said.contains("reconnecting"), "{said}");
}

/// `laned fetch` puts a built-in in the cache and names its files; a name
/// that is no built-in is refused naming the built-ins.
#[test]
fn laned_fetch_names_what_it_fetched_and_refuses_unknown_names() {
    let out = laned(&["fetch", "silero-vad"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("deepfilternet3"), "{}", text(&out));
    if or_skip("silero-vad", laned_models::silero::fetch()).is_none() {
        return;
    }
    let out = laned(&["fetch", "silero"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    let file = said.trim().strip_prefix("silero: ").unwrap_or_else(|| panic!("{said}"));
    assert!(Path::new(file).is_file(), "{said}");
}

/// The README's serve walk-through is `docs/serve-walkthrough.sh`'s
/// commands word for word, and the script runs: from a fresh folder, the
/// built-in fetched, served, a pulse file made and sent, answers on disk.
#[test]
fn the_readme_serve_walkthrough_runs_as_written() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let script_path = root.join("docs/serve-walkthrough.sh");
    let script = std::fs::read_to_string(&script_path).unwrap();
    let ours = script
        .split("# ---- README.md's commands, word for word, from here ----\n")
        .nth(1)
        .and_then(|rest| rest.split("# ---- to here ----").next())
        .expect("the script marks the README's commands");
    let section = readme
        .split("### Serve it: `laned serve`")
        .nth(1)
        .expect("the README has its serve section");
    let blocks: Vec<&str> = section
        .split("```sh\n")
        .skip(1)
        .filter_map(|b| b.split("```").next())
        .collect();
    assert!(
        blocks.contains(&ours),
        "no block of the README's serve section is the script's commands:\n{ours}"
    );
    if or_skip("silero-vad", laned_models::silero::fetch()).is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new("bash")
        .arg(&script_path)
        .arg(free_port().to_string())
        .arg(dir.path())
        .env("LANED", env!("CARGO_BIN_EXE_laned"))
        .output()
        .unwrap();
    let said = text(&out);
    assert_eq!(out.status.code(), Some(0), "{said}");
    assert!(said.contains("20 answers"), "{said}");
    assert_eq!(std::fs::read(dir.path().join("answers.raw")).unwrap().len(), 20 * 4);
}

/// A spec may name `vad-server`'s protocol for the built-in Silero: `laned
/// serve` then speaks it at the model's stream route and at `/v1/vad`
/// (PCM frames of any size, a JSON probability a chunk), each probability
/// the model's alone on the chunk with its context; `/v1/models` says which
/// protocol a model speaks; without such a model `/v1/vad` is 404 naming
/// the spec key, and another model's spec naming it is refused.
#[test]
fn a_spec_naming_the_vad_protocol_is_served_as_vad_server_serves_it() {
    if or_skip("silero-vad", laned_models::silero::fetch()).is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let tensor = dir.path().join("silero.toml");
    std::fs::write(&tensor, "[model]\nbuiltin = \"silero\"\n").unwrap();
    let vad = dir.path().join("vad.toml");
    std::fs::write(&vad, "[model]\nbuiltin = \"silero\"\nprotocol = \"vad\"\n").unwrap();
    let samples = laned_models::sound::samples(laned_models::sound::Sound::Noise, 9, 512 * 9);
    let pulses: Vec<Vec<u8>> = laned_models::silero::AUDIO
        .pulses(&samples)
        .iter()
        .map(|p| p.iter().flat_map(|x| x.to_le_bytes()).collect())
        .collect();
    let want: Vec<f32> = solo(&tensor, &[(2, 1)], &pulses)
        .iter()
        .map(|b| f32::from_le_bytes(b[..4].try_into().unwrap()))
        .collect();
    assert_eq!(want.len(), 9);
    let serving = serve(&[
        &format!("talk={}", vad.display()),
        &format!("plain={}", tensor.display()),
    ])
    .unwrap();
    let addr = serving.addr.to_string();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    for path in ["/v1/vad", "/v1/models/talk/stream"] {
        let got: Vec<f32> = runtime.block_on(async {
            let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{addr}{path}"))
                .await
                .unwrap();
            let bytes: Vec<u8> = samples.iter().flat_map(|x| x.to_le_bytes()).collect();
            // Frames of a size that is no chunk's: the protocol cuts them.
            for frame in bytes.chunks(4 * 700) {
                ws.send(Message::Binary(frame.to_vec().into())).await.unwrap();
            }
            let mut got = vec![];
            while got.len() < 9 {
                match ws.next().await.unwrap().unwrap() {
                    Message::Text(t) => {
                        let v: serde_json::Value = serde_json::from_str(&t).unwrap();
                        if let Some(p) = v.get("probability") {
                            assert_eq!(v["chunk"], got.len(), "{t}");
                            got.push(p.as_f64().unwrap() as f32);
                        }
                    }
                    Message::Ping(_) | Message::Pong(_) => continue,
                    other => panic!("{path}: {other:?}"),
                }
            }
            got
        });
        assert_eq!(got, want, "{path}");
    }
    let (status, listed) = get(&addr, "/v1/models");
    assert_eq!(status, 200, "{listed}");
    let listed: serde_json::Value = serde_json::from_str(&listed).unwrap();
    let speaks: Vec<(&str, &str)> = listed["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["name"].as_str().unwrap(), m["speaks"].as_str().unwrap()))
        .collect();
    assert_eq!(speaks, vec![("plain", "tensor"), ("talk", "vad")]);
    drop(serving);
    let plain = serve(&[&format!("plain={}", tensor.display())]).unwrap();
    let (status, said) = get(&plain.addr.to_string(), "/v1/vad");
    assert_eq!(status, 404, "{said}");
    assert!(said.contains("protocol = \"vad\""), "{said}");
    drop(plain);
    let gru = save(&fixtures::gru_cell(4, 8).unwrap().model, dir.path(), "gru.nnef.tar");
    let wrong = dir.path().join("wrong.toml");
    std::fs::write(&wrong, format!("[model]\nfile = {gru:?}\nprotocol = \"vad\"\n")).unwrap();
    let refused = serve(&[&format!("gru={}", wrong.display())]).err().expect("refused");
    assert!(refused.contains("builtin = \"silero\" only"), "{refused}");
}
