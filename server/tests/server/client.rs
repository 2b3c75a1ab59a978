//! `vad-client`, the binary, against a server on 127.0.0.1: its exit status
//! says how the run ended (one class per kind of ending) and its last line
//! on stderr sums it up; a WAV file in the extensible header format is read.

use crate::common::*;

use std::net::SocketAddr;
use std::process::Output;

use laned_models::silero::CHUNK;

/// Runs `vad-client --fast` against `addr` with `args`, bounded.
async fn client(addr: SocketAddr, args: &[&str]) -> Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_vad-client"))
        .arg("--fast")
        .arg("--url")
        .arg(format!("ws://{addr}/v1/vad"))
        .args(args)
        .kill_on_drop(true)
        .output()
        .await
        .unwrap()
}

/// The client's summary: its last line on stderr.
fn summary(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr)
        .lines()
        .last()
        .unwrap_or("")
        .to_string()
}

/// `samples` as a 16 kHz mono 16-bit WAV with a WAVE_FORMAT_EXTENSIBLE
/// header (what many tools write): format 0xFFFE, the PCM sub-format GUID.
fn extensible_wav(samples: &[f32]) -> Vec<u8> {
    let data: Vec<u8> = samples
        .iter()
        .flat_map(|s| ((s * 32768.0).round().clamp(-32768.0, 32767.0) as i16).to_le_bytes())
        .collect();
    let mut fmt = Vec::new();
    fmt.extend(0xFFFEu16.to_le_bytes());
    fmt.extend(1u16.to_le_bytes()); // channels
    fmt.extend(16_000u32.to_le_bytes());
    fmt.extend(32_000u32.to_le_bytes()); // bytes per second
    fmt.extend(2u16.to_le_bytes()); // block align
    fmt.extend(16u16.to_le_bytes()); // bits per sample
    fmt.extend(22u16.to_le_bytes()); // extension size
    fmt.extend(16u16.to_le_bytes()); // valid bits
    fmt.extend(4u32.to_le_bytes()); // channel mask: front centre
    fmt.extend([
        0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x10, 0x00, 0x80, 0x00, 0x00, 0xAA, 0x00, 0x38, 0x9B, 0x71,
    ]);
    let mut wav = b"RIFF".to_vec();
    wav.extend(((4 + 8 + fmt.len() + 8 + data.len()) as u32).to_le_bytes());
    wav.extend(b"WAVEfmt ");
    wav.extend((fmt.len() as u32).to_le_bytes());
    wav.extend(&fmt);
    wav.extend(b"data");
    wav.extend((data.len() as u32).to_le_bytes());
    wav.extend(data);
    wav
}

/// Every chunk answered and a normal close: exit 0, the summary counting
/// the chunks; the generated audio and an extensible WAV alike.
#[test]
fn silero_vad_client_exits_0_and_sums_up() {
    let Some(plan) = plan() else { return };
    bounded(90, async {
        let server = server(&plan, 2, 1, 1_000).await;
        let out = client(server.addr, &[]).await;
        let line = summary(&out);
        assert_eq!(out.status.code(), Some(0), "{line}");
        // Generated audio: 4 s at 16 kHz, 125 whole chunks.
        assert!(line.contains("sent 125 chunks, answered 125 of 125"), "{line}");
        let dir = tempfile::tempdir().unwrap();
        let wav = dir.path().join("extensible.wav");
        let samples = audio(1, 20);
        std::fs::write(&wav, extensible_wav(&samples)).unwrap();
        let out = client(server.addr, &["--i16", wav.to_str().unwrap()]).await;
        let line = summary(&out);
        assert_eq!(out.status.code(), Some(0), "{line}");
        let n = samples.len() / CHUNK;
        assert!(line.contains(&format!("answered {n} of {n}")), "{line}");
        server.shutdown().await;
    });
}

/// A server with its one lane held answers 1013: exit 3 (busy); a frame
/// over the server's limit gets 1009: exit 5 (refused); nobody listening:
/// exit 1 (transport).
#[test]
fn silero_vad_client_exit_status_says_how_it_ended() {
    let Some(plan) = plan() else { return };
    let a = audio(0, 2);
    bounded(90, async {
        let server = server(&plan, 1, 1, 300).await;
        let held = connect_holding(server.addr, &a[..CHUNK]).await;
        let out = client(server.addr, &[]).await;
        let line = summary(&out);
        assert_eq!(out.status.code(), Some(3), "{line}");
        assert!(line.contains("closed 1013"), "{line}");
        drop(held);
        wait_status(server.addr, "/ready", 200, std::time::Duration::from_secs(10)).await;
        // 20,000 f32 samples: 80,000 bytes, over the 64 KiB the test
        // server takes.
        let out = client(server.addr, &["--frame", "20000"]).await;
        let line = summary(&out);
        assert_eq!(out.status.code(), Some(5), "{line}");
        assert!(line.contains("closed 1009"), "{line}");
        let addr = server.addr;
        server.shutdown().await;
        let out = client(addr, &[]).await;
        assert_eq!(out.status.code(), Some(1), "{}", summary(&out));
    });
}
