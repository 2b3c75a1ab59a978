//! Streams a WAV file (16 kHz mono, 16-bit PCM or 32-bit float, plain or
//! extensible header) or generated audio to a vad-server, in real time or
//! as fast as possible, and prints the speech events (and, with
//! `--verbose`, every probability). Ends with a one-line summary on stderr
//! (chunks sent, chunks answered, the close) and an exit status per class
//! of ending: see [`Exit`].

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message;

/// How a run ended, as the process's exit status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Exit {
    /// Every chunk answered, the connection closed normally.
    Done = 0,
    /// No connection, or it dropped without a close frame.
    Transport = 1,
    /// The input (the WAV file) is unusable.
    Input = 2,
    /// 1013: no lane freed up in time; try again later.
    Busy = 3,
    /// 1001 or 1012: the server is going away or restarting; retry
    /// (elsewhere).
    GoingAway = 4,
    /// 1003, 1008 or 1009: the server refused what was sent (a format, an
    /// idle connection, a frame too big).
    Refused = 5,
    /// 1011 or any other code: the server failed the stream.
    ServerError = 6,
    /// Closed normally, but chunks went unanswered.
    Unanswered = 7,
}

impl Exit {
    /// The class of a close frame's code (`None`: no code, a normal close).
    fn of_close(code: Option<u16>) -> Exit {
        match code {
            None | Some(1000) => Exit::Done,
            Some(1013) => Exit::Busy,
            Some(1001 | 1012) => Exit::GoingAway,
            Some(1003 | 1008 | 1009) => Exit::Refused,
            Some(_) => Exit::ServerError,
        }
    }
}

const AFTER_HELP: &str = "Exit status: 0 every chunk answered and closed normally; 1 no connection or \
dropped without a close frame; 2 unusable input; 3 busy (1013, try again later); 4 going away \
(1001, 1012); 5 refused (1003, 1008, 1009); 6 server error (1011, other codes); 7 closed with \
chunks unanswered.";

/// Streams audio to vad-server and prints its speech events.
#[derive(Debug, Parser)]
#[command(name = "vad-client", after_help = AFTER_HELP)]
struct Args {
    /// The server's WebSocket URL.
    #[arg(long, env = "VAD_URL", default_value = "ws://127.0.0.1:8080/v1/vad")]
    url: String,
    /// A 16 kHz mono WAV file (16-bit PCM or 32-bit float); none: generated
    /// audio (silence, a buzz, silence).
    wav: Option<PathBuf>,
    /// Send as fast as possible instead of in real time.
    #[arg(long)]
    fast: bool,
    /// Samples per frame sent.
    #[arg(long, default_value_t = 1600)]
    frame: usize,
    /// Send 16-bit PCM (`?format=i16`) instead of 32-bit float.
    #[arg(long)]
    i16: bool,
    /// Print every chunk's probability too.
    #[arg(long)]
    verbose: bool,
}

fn read_wav(path: &PathBuf) -> Result<Vec<f32>, String> {
    let b = std::fs::read(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    if b.len() < 12 || &b[0..4] != b"RIFF" || &b[8..12] != b"WAVE" {
        return Err("not a RIFF/WAVE file".into());
    }
    let (mut fmt, mut i) = (None, 12);
    while i + 8 <= b.len() {
        let id = &b[i..i + 4];
        let len = u32::from_le_bytes([b[i + 4], b[i + 5], b[i + 6], b[i + 7]]) as usize;
        let body = &b[i + 8..(i + 8 + len).min(b.len())];
        if id == b"fmt " && body.len() >= 16 {
            let tag = u16::from_le_bytes([body[0], body[1]]);
            let channels = u16::from_le_bytes([body[2], body[3]]);
            let rate = u32::from_le_bytes([body[4], body[5], body[6], body[7]]);
            let bits = u16::from_le_bytes([body[14], body[15]]);
            // WAVE_FORMAT_EXTENSIBLE: the format is the first two bytes of
            // the sub-format GUID, after the extension's size, valid bits
            // and channel mask.
            let tag = if tag == 0xFFFE && body.len() >= 26 {
                u16::from_le_bytes([body[24], body[25]])
            } else {
                tag
            };
            if channels != 1 || rate != 16_000 {
                return Err(format!("{channels} channels at {rate} Hz: 16 kHz mono wanted"));
            }
            fmt = Some((tag, bits));
        } else if id == b"data" {
            return match fmt {
                Some((1, 16)) => Ok(body
                    .chunks_exact(2)
                    .map(|s| i16::from_le_bytes([s[0], s[1]]) as f32 / 32768.0)
                    .collect()),
                Some((3, 32)) => Ok(body
                    .chunks_exact(4)
                    .map(|s| f32::from_le_bytes([s[0], s[1], s[2], s[3]]))
                    .collect()),
                Some((tag, bits)) => Err(format!(
                    "format {tag} with {bits} bits: 16-bit PCM or 32-bit float wanted"
                )),
                None => Err("data before fmt".into()),
            };
        }
        i += 8 + len + (len & 1);
    }
    Err("no data chunk".into())
}

fn generated() -> Vec<f32> {
    let mut audio = vec![0.0f32; 16_000];
    audio.extend(laned_models::sound::samples(
        laned_models::sound::Sound::Buzz,
        7,
        32_000,
    ));
    audio.extend(vec![0.0f32; 16_000]);
    audio
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let audio = match &args.wav {
        Some(p) => read_wav(p).unwrap_or_else(|e| {
            eprintln!("vad-client: {e}");
            std::process::exit(Exit::Input as i32)
        }),
        None => generated(),
    };
    let url = match (args.i16, args.url.contains('?')) {
        (false, _) => args.url.clone(),
        (true, false) => format!("{}?format=i16", args.url),
        (true, true) => format!("{}&format=i16", args.url),
    };
    let (ws, _) = tokio_tungstenite::connect_async(url.as_str())
        .await
        .unwrap_or_else(|e| {
            eprintln!("vad-client: connecting to {url}: {e}");
            std::process::exit(Exit::Transport as i32)
        });
    let (mut tx, mut rx) = ws.split();
    // The server answers every whole 512-sample chunk; closing before the
    // last answer came would lose it (a close ends the server's sending).
    let expected = audio.len() / laned_models::silero::CHUNK;
    let (all_in, all_in_rx) = tokio::sync::oneshot::channel::<()>();
    let mut all_in = (expected > 0).then_some(all_in);
    let frame = args.frame.max(1);
    let fast = args.fast;
    let i16_format = args.i16;
    let samples_sent = Arc::new(AtomicUsize::new(0));
    let sent = samples_sent.clone();
    let sender = tokio::spawn(async move {
        let start = tokio::time::Instant::now();
        for (i, f) in audio.chunks(frame).enumerate() {
            if !fast {
                tokio::time::sleep_until(start + Duration::from_secs_f64((i * frame) as f64 / 16_000.0)).await;
            }
            let bytes: Vec<u8> = if i16_format {
                f.iter()
                    .flat_map(|s| ((s * 32768.0).round().clamp(-32768.0, 32767.0) as i16).to_le_bytes())
                    .collect()
            } else {
                f.iter().flat_map(|s| s.to_le_bytes()).collect()
            };
            if tx.send(Message::Binary(bytes.into())).await.is_err() {
                return;
            }
            sent.fetch_add(f.len(), Ordering::Relaxed);
        }
        // Every answer in (or the connection gone, or 30 s), then close.
        if expected > 0 {
            let _ = tokio::time::timeout(Duration::from_secs(30), all_in_rx).await;
        }
        let _ = tx.send(Message::Close(None)).await;
    });
    let mut answered = 0;
    // `None` until the connection ends: then the close's code (`Some(None)`
    // for a close frame without one), or a transport error.
    let mut closed: Option<Option<(u16, String)>> = None;
    let mut transport: Option<String> = None;
    while let Some(msg) = rx.next().await {
        match msg {
            Ok(Message::Text(t)) => {
                if t.contains("\"event\"") || args.verbose {
                    println!("{t}");
                }
                if t.contains("\"probability\"") {
                    answered += 1;
                    if answered == expected {
                        if let Some(all_in) = all_in.take() {
                            let _ = all_in.send(());
                        }
                    }
                }
            }
            Ok(Message::Close(Some(f))) => {
                println!("closed: {} {}", u16::from(f.code), f.reason);
                closed = Some(Some((u16::from(f.code), f.reason.to_string())));
                break;
            }
            Ok(Message::Close(None)) => {
                closed = Some(None);
                break;
            }
            Ok(_) => {}
            Err(e) => {
                transport = Some(e.to_string());
                break;
            }
        }
    }
    sender.abort();
    let chunks_sent = samples_sent.load(Ordering::Relaxed) / laned_models::silero::CHUNK;
    let (exit, how) = match (&closed, &transport) {
        (Some(Some((code, reason))), _) => (Exit::of_close(Some(*code)), format!("closed {code} {reason}")),
        (Some(None), _) => (Exit::Done, "closed".to_string()),
        (None, Some(e)) => (Exit::Transport, format!("dropped: {e}")),
        (None, None) => (Exit::Transport, "dropped without a close frame".to_string()),
    };
    let exit = if exit == Exit::Done && answered < expected {
        Exit::Unanswered
    } else {
        exit
    };
    eprintln!(
        "vad-client: sent {chunks_sent} chunks, answered {answered} of {expected}, {}, exit {}",
        how.trim_end(),
        exit as i32
    );
    std::process::exit(exit as i32)
}
