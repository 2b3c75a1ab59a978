//! Streams a WAV file (16 kHz mono, 16-bit PCM or 32-bit float, plain or
//! extensible header) or generated audio to a vad-server, in real time or
//! as fast as possible, and prints the speech events (and, with
//! `--verbose`, every probability). Ends with a one-line summary on stderr
//! (chunks sent, chunks answered, the close) and an exit status per class
//! of ending: see [`Exit`].
//!
//! Each run is one stream with an id (`--stream-id`, else a random one)
//! sent as `x-stream-id`. Where the server hands streams over (it says
//! `x-resume-chunk` on the upgrade), a close 1012 or a dropped connection
//! is not the end: the client reconnects with the same id, to whichever
//! replica the proxy picks, and resends its audio from the chunk the new
//! connection names; answers it already printed are not printed again.
//! A reconnect sends the generation the last upgrade said
//! (`x-resume-generation`), so a record older than it is never resumed
//! from (the server restarts the stream at 0 instead).

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use futures_util::{SinkExt, StreamExt};
use laned_models::silero::CHUNK;
use laned_wire::close;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

type Ws = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// How a connection sends.
#[derive(Clone, Copy)]
struct Connection {
    frame: usize,
    fast: bool,
    i16_format: bool,
    verbose: bool,
    /// When the run started (real time is kept from it across reconnects).
    started: tokio::time::Instant,
}

/// One connection: sends `audio` from chunk `from` on and prints the
/// answers not printed yet (`answered` counts them); how it ended and the
/// chunks sent up to then (counted from the stream's start).
async fn stream_once(
    ws: Ws,
    audio: &Arc<Vec<f32>>,
    from: usize,
    how: Connection,
    answered: &mut usize,
    lost: &mut usize,
    expected: usize,
) -> (Ending, usize) {
    let (mut tx, mut rx) = ws.split();
    // The server answers every whole 512-sample chunk; closing before the
    // last answer came would lose it (a close ends the server's sending).
    let (all_in, all_in_rx) = tokio::sync::oneshot::channel::<()>();
    let mut all_in = (expected > *answered).then_some(all_in);
    let samples_sent = Arc::new(AtomicUsize::new(from * CHUNK));
    let sent = samples_sent.clone();
    let audio = audio.clone();
    let last = expected > 0;
    let sender = tokio::spawn(async move {
        let base = from * CHUNK;
        for (i, f) in audio[base..].chunks(how.frame).enumerate() {
            if !how.fast {
                let at = (base + i * how.frame) as f64 / 16_000.0;
                tokio::time::sleep_until(how.started + Duration::from_secs_f64(at)).await;
            }
            let bytes: Vec<u8> = if how.i16_format {
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
        if last {
            let _ = tokio::time::timeout(Duration::from_secs(30), all_in_rx).await;
        }
        let _ = tx.send(Message::Close(None)).await;
    });
    // Answers to chunks already printed (a resume from a checkpoint
    // answers them again), and the events that follow them, are not
    // printed twice.
    let mut replaying = false;
    let mut ending = Ending::Dropped("the connection ended".into());
    while let Some(msg) = rx.next().await {
        match msg {
            Ok(Message::Text(t)) => {
                if t.contains("\"resume\"") {
                    continue;
                }
                if t.contains("\"probability\"") {
                    let chunk = serde_json::from_str::<serde_json::Value>(&t)
                        .ok()
                        .and_then(|v| v["chunk"].as_u64())
                        .unwrap_or(u64::MAX) as usize;
                    replaying = chunk < *answered;
                    if replaying {
                        continue;
                    }
                    // Past the next one expected: the answers between were
                    // lost with a crashed replica (the checkpoint it
                    // resumed from is later than what reached us).
                    *lost += chunk.saturating_sub(*answered);
                    *answered = chunk.max(*answered) + 1;
                    if how.verbose {
                        println!("{t}");
                    }
                    if *answered == expected {
                        if let Some(all_in) = all_in.take() {
                            let _ = all_in.send(());
                        }
                    }
                } else if t.contains("\"event\"") && !replaying {
                    println!("{t}");
                }
            }
            Ok(Message::Close(Some(f))) => {
                println!("closed: {} {}", u16::from(f.code), f.reason);
                ending = Ending::Closed(Some(u16::from(f.code)), f.reason.to_string());
                break;
            }
            Ok(Message::Close(None)) => {
                ending = if *answered == expected {
                    Ending::Done
                } else {
                    Ending::Closed(None, String::new())
                };
                break;
            }
            Ok(_) => {}
            Err(e) => {
                ending = Ending::Dropped(e.to_string());
                break;
            }
        }
    }
    sender.abort();
    (ending, samples_sent.load(Ordering::Relaxed) / CHUNK)
}

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
            None | Some(close::NORMAL) => Exit::Done,
            Some(close::TRY_AGAIN_LATER) => Exit::Busy,
            Some(close::GOING_AWAY | close::RESTART) => Exit::GoingAway,
            Some(close::UNSUPPORTED | close::IDLE | close::TOO_BIG) => Exit::Refused,
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
    /// The stream's id, sent as `x-stream-id` (what a proxy hashes, and
    /// what a hand-over is stored under) [default: a random one].
    #[arg(long)]
    stream_id: Option<String>,
    /// How long to keep reconnecting after a 1012 or a dropped connection
    /// (where the server hands streams over), in milliseconds, counted
    /// from each interruption (a stream moved twice gets the window twice);
    /// 0: never.
    #[arg(long, default_value_t = 30_000)]
    resume_for_ms: u64,
}

/// Until when a stream interrupted at `now` keeps reconnecting: the window
/// of the interruption under way (`until`, its reconnects not resumed yet),
/// or a new one of `window` when there is none or the stream resumed
/// since: each interruption gets the whole window.
fn resume_window(
    until: Option<tokio::time::Instant>,
    resumed_since: bool,
    now: tokio::time::Instant,
    window: Duration,
) -> tokio::time::Instant {
    match until {
        Some(until) if !resumed_since => until,
        _ => now + window,
    }
}

/// A random stream id: 128 bits from std's randomly keyed hasher (no
/// dependency for it).
fn random_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    let half = || {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_nanos(),
        );
        h.write_u32(std::process::id());
        h.finish()
    };
    format!("{:016x}{:016x}", half(), half())
}

/// How one connection ended.
enum Ending {
    /// Every chunk answered (the client closed).
    Done,
    /// A close frame: its code (`None`: none) and reason.
    Closed(Option<u16>, String),
    /// Dropped without a close frame.
    Dropped(String),
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
    let id = args.stream_id.clone().unwrap_or_else(random_id);
    let expected = audio.len() / CHUNK;
    let audio = Arc::new(audio);
    let frame = args.frame.max(1);
    let (fast, i16_format, verbose) = (args.fast, args.i16, args.verbose);
    let started = tokio::time::Instant::now();
    // The chunks answered and printed (the next one to print), and the
    // most chunks sent on any connection.
    let mut answered = 0;
    let mut lost = 0;
    let mut chunks_sent = 0;
    let mut resumes = 0;
    // Whether the server hands streams over (it said x-resume-chunk).
    let mut resumable = false;
    let mut resuming_until: Option<tokio::time::Instant> = None;
    // Set once a reconnection resumed the stream: the next interruption
    // starts a window of its own (each interruption gets `resume_for_ms`).
    let mut resumed_since = false;
    // The stream's generation, as the last upgrade said it
    // (`x-resume-generation`): sent back on a reconnect, so the server
    // never resumes from a record older than it (it restarts at 0, said).
    let mut generation: Option<tokio_tungstenite::tungstenite::http::HeaderValue> = None;
    let ending = loop {
        let mut request = match url.as_str().into_client_request() {
            Ok(r) => r,
            Err(e) => {
                eprintln!("vad-client: {url}: {e}");
                std::process::exit(Exit::Input as i32)
            }
        };
        match id.parse() {
            Ok(v) => request.headers_mut().insert("x-stream-id", v),
            Err(_) => {
                eprintln!("vad-client: the stream id {id:?} cannot be a header");
                std::process::exit(Exit::Input as i32)
            }
        };
        if let Some(g) = &generation {
            request.headers_mut().insert("x-resume-generation", g.clone());
        }
        let (ws, response) = match tokio_tungstenite::connect_async(request).await {
            Ok(c) => c,
            Err(e) => match resuming_until {
                Some(until) if tokio::time::Instant::now() < until => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
                _ => {
                    eprintln!("vad-client: connecting to {url}: {e}");
                    std::process::exit(Exit::Transport as i32)
                }
            },
        };
        let from = response
            .headers()
            .get("x-resume-chunk")
            .and_then(|v| v.to_str().ok()?.parse::<usize>().ok());
        if let Some(g) = response.headers().get("x-resume-generation") {
            generation = Some(g.clone());
        }
        let from = match (from, resuming_until.is_some()) {
            (Some(f), _) => {
                resumable = true;
                f.min(expected)
            }
            (None, false) => 0,
            // Reconnected to a server that keeps no state: a fresh stream
            // would answer other probabilities, so the run ends here.
            (None, true) => break Ending::Dropped("reconnected to a server that resumes no stream".into()),
        };
        if resuming_until.is_some() {
            resumed_since = true;
            resumes += 1;
            eprintln!("vad-client: stream {id} resumed at chunk {from}");
        }
        let ending = stream_once(
            ws,
            &audio,
            from,
            Connection {
                frame,
                fast,
                i16_format,
                verbose,
                started,
            },
            &mut answered,
            &mut lost,
            expected,
        )
        .await;
        chunks_sent = chunks_sent.max(ending.1);
        match ending.0 {
            Ending::Closed(Some(close::RESTART), _) | Ending::Dropped(_)
                if resumable && args.resume_for_ms > 0 && answered < expected =>
            {
                let until = resume_window(
                    resuming_until,
                    std::mem::take(&mut resumed_since),
                    tokio::time::Instant::now(),
                    Duration::from_millis(args.resume_for_ms),
                );
                if tokio::time::Instant::now() >= until {
                    break ending.0;
                }
                resuming_until = Some(until);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            other => break other,
        }
    };
    let (exit, how) = match &ending {
        Ending::Closed(Some(code), reason) => (Exit::of_close(Some(*code)), format!("closed {code} {reason}")),
        Ending::Closed(None, _) | Ending::Done => (Exit::Done, "closed".to_string()),
        Ending::Dropped(e) => (Exit::Transport, format!("dropped: {e}")),
    };
    let exit = if exit == Exit::Done && (answered < expected || lost > 0) {
        Exit::Unanswered
    } else {
        exit
    };
    let how = match (resumes, lost) {
        (0, _) => how,
        (_, 0) => format!("{} (stream {id}, resumed {resumes} times)", how.trim_end()),
        _ => format!(
            "{} (stream {id}, resumed {resumes} times, {lost} answers lost with a crashed replica)",
            how.trim_end()
        ),
    };
    let answered = answered - lost;
    eprintln!(
        "vad-client: sent {chunks_sent} chunks, answered {answered} of {expected}, {}, exit {}",
        how.trim_end(),
        exit as i32
    );
    std::process::exit(exit as i32)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every interruption gets the whole window: a second one, 33 s after a
    /// first that resumed, is not cut by the first's 30 s; retries within
    /// one interruption share its window.
    #[test]
    fn each_interruption_gets_its_own_window() {
        let w = Duration::from_secs(30);
        let t0 = tokio::time::Instant::now();
        let first = resume_window(None, false, t0, w);
        assert_eq!(first, t0 + w);
        assert_eq!(resume_window(Some(first), false, t0 + Duration::from_secs(5), w), first);
        let later = t0 + Duration::from_secs(33);
        assert_eq!(resume_window(Some(first), true, later, w), later + w);
    }
}
