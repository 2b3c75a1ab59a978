//! `laned client`: one stream of a model served by `laned serve`, from a
//! file. The input is a raw file of whole pulses (every fed input in order,
//! little-endian, as the hello describes them) or a WAV file (16-bit PCM or
//! 32-bit float, mono) for a model fed one `f32` input: cut as the hello's
//! `audio` says (its sample rate checked, each pulse its context then its
//! hop), else into pulses of that input's size back to back (the last one
//! padded with zeros). Every answer's bytes go to the output file, in
//! order (with `?format=json` in the URL, each answer's JSON as a line).
//!
//! The stream has an id (`--stream`, else 128 random bits in hex): a close
//! 1012 or a dropped connection is not the end while `--resume-for-ms`
//! allows (the window starts over at each interruption): the client
//! reconnects with the id and resends from the pulse the new hello names.
//! A URL that never answered is not retried (exit 1 at once). The exit
//! status says how the run ended, in `vad-client`'s classes ([`Exit`]).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use laned_wire::close;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

/// What `laned client` was asked.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// The stream's URL: `ws://HOST:PORT/v1/models/NAME/stream`.
    pub url: String,
    /// The input: a raw file of whole pulses, or a `.wav`.
    pub input: PathBuf,
    /// Where every answer's bytes go.
    pub output: PathBuf,
    /// The stream's id (sent as `x-stream-id`) [default: 128 random bits,
    /// in hex: a record is anyone's who knows its id].
    #[arg(long)]
    pub stream: Option<String>,
    /// How long, from each interruption (1012, a dropped connection), the
    /// client keeps reconnecting, in milliseconds; 0: never.
    #[arg(long, default_value_t = 30_000)]
    pub resume_for_ms: u64,
    /// Send a pulse every this many milliseconds (a real-time source);
    /// 0: each as soon as the last is answered.
    #[arg(long, default_value_t = 0)]
    pub every_ms: u64,
}

/// How a run ended, as the process's exit status (`vad-client`'s classes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Every pulse answered, the stream closed normally.
    Done = 0,
    /// No connection, or it dropped and could not be resumed.
    Transport = 1,
    /// The input is unusable (not whole pulses, an unreadable WAV).
    Input = 2,
    /// 1013: no lane freed up in time; try again later.
    Busy = 3,
    /// 1001, or 1012 past the resume window: the server went away.
    GoingAway = 4,
    /// 1003, 1008 or 1009: the server refused what was sent.
    Refused = 5,
    /// 1011 or any other code: the server failed the stream.
    ServerError = 6,
}

impl Exit {
    fn of_close(code: u16) -> Exit {
        match code {
            close::NORMAL => Exit::Done,
            close::TRY_AGAIN_LATER => Exit::Busy,
            close::GOING_AWAY | close::RESTART => Exit::GoingAway,
            close::UNSUPPORTED | close::IDLE | close::TOO_BIG => Exit::Refused,
            _ => Exit::ServerError,
        }
    }
}

/// The pulses in `input`, for a stream whose hello is `hello`.
fn pulses(input: &Path, hello: &serde_json::Value) -> Result<Vec<Vec<u8>>, String> {
    let ports = hello["inputs"].as_array().ok_or("the hello lists no inputs")?;
    let width = |dtype: &str| match dtype {
        "f64" | "i64" => Some(8),
        "f32" | "i32" => Some(4),
        "f16" | "i16" => Some(2),
        "i8" | "u8" | "bool" => Some(1),
        _ => None,
    };
    let mut pulse_bytes = 0;
    for p in ports {
        let dtype = p["dtype"].as_str().unwrap_or("");
        let len: u64 = p["shape"]
            .as_array()
            .map_or(0, |s| s.iter().filter_map(|d| d.as_u64()).product());
        pulse_bytes +=
            len as usize * width(dtype).ok_or_else(|| format!("input {}: dtype {dtype:?} unknown", p["name"]))?;
    }
    let is_wav = input.extension().is_some_and(|e| e.eq_ignore_ascii_case("wav"));
    let bytes = if is_wav {
        if ports.len() != 1 || ports[0]["dtype"] != "f32" {
            return Err(format!(
                "{}: a WAV feeds a model of one f32 input; this one takes {}",
                input.display(),
                serde_json::Value::Array(ports.clone())
            ));
        }
        let mut reader = hound::WavReader::open(input).map_err(|e| format!("{}: {e}", input.display()))?;
        let spec = reader.spec();
        if spec.channels != 1 {
            return Err(format!("{}: {} channels, wanted mono", input.display(), spec.channels));
        }
        let samples: Vec<f32> = match (spec.sample_format, spec.bits_per_sample) {
            (hound::SampleFormat::Int, 16) => reader
                .samples::<i16>()
                .map(|s| s.map(|s| s as f32 / 32768.0))
                .collect::<Result<_, _>>(),
            (hound::SampleFormat::Float, 32) => reader.samples::<f32>().collect::<Result<_, _>>(),
            (format, bits) => {
                return Err(format!(
                    "{}: {bits}-bit {format:?} samples, wanted 16-bit PCM or 32-bit float",
                    input.display()
                ))
            }
        }
        .map_err(|e| format!("{}: {e}", input.display()))?;
        match hello.get("audio").filter(|a| !a.is_null()) {
            // The model says how its audio is cut: at its rate, with its
            // context.
            Some(audio) => {
                let framing: laned_models::spec::AudioFraming =
                    serde_json::from_value(audio.clone()).map_err(|e| format!("the hello's audio {audio}: {e}"))?;
                if spec.sample_rate != framing.sample_rate {
                    return Err(format!(
                        "{}: {} Hz, the model takes {} Hz (resample it first, e.g. `sox IN.wav -r {} OUT.wav`)",
                        input.display(),
                        spec.sample_rate,
                        framing.sample_rate,
                        framing.sample_rate
                    ));
                }
                if framing.pulse_len() * 4 != pulse_bytes {
                    return Err(format!(
                        "the hello's audio cuts pulses of {} samples; its input takes {pulse_bytes} bytes",
                        framing.pulse_len()
                    ));
                }
                framing
                    .pulses(&samples)
                    .concat()
                    .iter()
                    .flat_map(|s| s.to_le_bytes())
                    .collect()
            }
            // Else back to back, the input's size each.
            None => {
                let mut bytes: Vec<u8> = samples.iter().flat_map(|s| s.to_le_bytes()).collect();
                bytes.resize(bytes.len().div_ceil(pulse_bytes) * pulse_bytes, 0);
                bytes
            }
        }
    } else {
        let bytes = std::fs::read(input).map_err(|e| format!("{}: {e}", input.display()))?;
        if pulse_bytes == 0 || !bytes.len().is_multiple_of(pulse_bytes) {
            return Err(format!(
                "{}: {} bytes is not a whole number of {pulse_bytes}-byte pulses",
                input.display(),
                bytes.len()
            ));
        }
        bytes
    };
    Ok(bytes.chunks(pulse_bytes.max(1)).map(<[u8]>::to_vec).collect())
}

/// How one connection ended.
enum Ending {
    /// Every pulse sent was answered and the client closed.
    Done,
    /// The server closed with this code and reason.
    Closed(u16, String),
    /// The connection dropped without a close.
    Dropped(String),
}

/// One connection as stream `id`: sends the pulses from the hello's
/// position on, each answered in turn, the answers appended to `answers`.
/// `generation`: the stream's generation the last hello said, sent back
/// (`x-resume-generation`) so that the server never resumes the stream
/// from a record older than it knew; set from this hello.
async fn once(
    args: &Args,
    (id, generation): (&str, &mut Option<u64>),
    pulses: &mut Option<Vec<Vec<u8>>>,
    answers: &mut Vec<Vec<u8>>,
) -> Result<Ending, Exit> {
    let mut request = args.url.as_str().into_client_request().map_err(|e| {
        eprintln!("laned client: {}: {e}", args.url);
        Exit::Input
    })?;
    request
        .headers_mut()
        .insert("x-stream-id", id.parse().map_err(|_| Exit::Input)?);
    if let Some(g) = *generation {
        request.headers_mut().insert("x-resume-generation", g.into());
    }
    let mut ws = match tokio_tungstenite::connect_async(request).await {
        Ok((ws, _)) => ws,
        // An answer without the upgrade (an unknown model: 404; 503 past
        // the connection cap) is the server's word, said as it gave it.
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => {
            let body = String::from_utf8_lossy(r.body().as_deref().unwrap_or_default())
                .trim()
                .to_string();
            let code = r.status().as_u16();
            eprintln!("laned client: {}: HTTP {code}: {body}", args.url);
            return Err(if code == 503 { Exit::Busy } else { Exit::Refused });
        }
        // A URL that never answered is no stream to resume: said once, at
        // once (a wrong host or port is not retried for the whole window).
        Err(e) if pulses.is_none() => {
            eprintln!("laned client: {}: cannot connect: {e}", args.url);
            return Err(Exit::Transport);
        }
        Err(e) => return Ok(Ending::Dropped(e.to_string())),
    };
    let hello: serde_json::Value = match ws.next().await {
        Some(Ok(Message::Text(t))) => serde_json::from_str(&t).unwrap_or_default(),
        Some(Ok(Message::Close(Some(f)))) => return Ok(Ending::Closed(f.code.into(), f.reason.to_string())),
        other => return Ok(Ending::Dropped(format!("{other:?} where the hello was due"))),
    };
    if pulses.is_none() {
        *pulses = Some(pulses_of(&args.input, &hello)?);
    }
    let pulses = pulses.as_ref().expect("read above");
    let json = hello["format"] == "json";
    let from = hello["resume"].as_u64().unwrap_or(0) as usize;
    if let Some(why) = hello["restarted"].as_str() {
        eprintln!("laned client: the server restarts the stream at pulse 0: {why}");
    }
    if let Some(g) = hello["generation"].as_u64() {
        *generation = Some(g);
    }
    if from > answers.len() {
        eprintln!(
            "laned client: the server resumes at pulse {from}, {} answered here",
            answers.len()
        );
        return Err(Exit::ServerError);
    }
    answers.truncate(from);
    let mut every = (args.every_ms > 0).then(|| tokio::time::interval(Duration::from_millis(args.every_ms)));
    for p in &pulses[from..] {
        if let Some(every) = &mut every {
            every.tick().await;
        }
        if let Err(e) = ws.send(Message::Binary(p.clone().into())).await {
            return Ok(Ending::Dropped(e.to_string()));
        }
        loop {
            match ws.next().await {
                Some(Ok(Message::Binary(b))) => {
                    answers.push(b.to_vec());
                    break;
                }
                // `?format=json`: each answer a line of JSON.
                Some(Ok(Message::Text(t))) if json => {
                    answers.push(format!("{}\n", t.as_str()).into_bytes());
                    break;
                }
                Some(Ok(Message::Close(Some(f)))) => return Ok(Ending::Closed(f.code.into(), f.reason.to_string())),
                Some(Ok(Message::Close(None))) | None => return Ok(Ending::Dropped("closed without a code".into())),
                Some(Ok(_)) => continue,
                Some(Err(e)) => return Ok(Ending::Dropped(e.to_string())),
            }
        }
    }
    let _ = ws.close(None).await;
    Ok(Ending::Done)
}

fn pulses_of(input: &Path, hello: &serde_json::Value) -> Result<Vec<Vec<u8>>, Exit> {
    pulses(input, hello).map_err(|why| {
        eprintln!("laned client: {why}");
        Exit::Input
    })
}

/// The run: connections until the stream is done or cannot go on.
async fn stream(args: &Args) -> Exit {
    let id = match &args.stream {
        Some(id) => id.clone(),
        None => match unguessable_id() {
            Ok(id) => id,
            Err(e) => {
                eprintln!("laned client: making a stream id: {e}");
                return Exit::Input;
            }
        },
    };
    let (mut pulses, mut answers, mut generation) = (None, Vec::new(), None);
    let mut interrupted: Option<tokio::time::Instant> = None;
    let window = Duration::from_millis(args.resume_for_ms);
    let exit = loop {
        let answered = answers.len();
        let ending = match once(args, (&id, &mut generation), &mut pulses, &mut answers).await {
            Ok(e) => e,
            Err(exit) => break exit,
        };
        let (exit, why, resumable) = match ending {
            Ending::Done => break Exit::Done,
            Ending::Closed(code, why) => (
                Exit::of_close(code),
                format!("closed {code}: {why}"),
                code == close::RESTART,
            ),
            Ending::Dropped(why) => (Exit::Transport, why, true),
        };
        // The window starts over at each interruption the stream got past.
        if answers.len() > answered {
            interrupted = None;
        }
        let since = *interrupted.get_or_insert_with(tokio::time::Instant::now);
        if !resumable || window.is_zero() || since.elapsed() > window {
            eprintln!("laned client: stream {id}: {why}");
            break exit;
        }
        eprintln!("laned client: stream {id}: {why}: reconnecting");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    if let Err(e) = std::fs::write(&args.output, answers.concat()) {
        eprintln!("laned client: writing {}: {e}", args.output.display());
        return Exit::Input;
    }
    eprintln!(
        "laned client: stream {id}: {} pulses answered, exit {}",
        answers.len(),
        exit as i32
    );
    exit
}

/// A stream id nobody else can guess (whoever knows a stream's id can take
/// its record over): 128 bits from the system's random source, in hex.
fn unguessable_id() -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

pub fn run(args: &Args) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("laned client: starting the runtime: {e}");
            return ExitCode::from(Exit::Transport as u8);
        }
    };
    ExitCode::from(runtime.block_on(stream(args)) as u8)
}
