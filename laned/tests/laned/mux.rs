//! The multiplexed front (`/v1/models/NAME/mux`) as a gateway uses it:
//! many streams on one WebSocket, records encoded here from the documented
//! bytes (not with the server's own codec), every answer checked against
//! the model run alone; a bad record closes only its stream; a rolling
//! restart hands every stream over to another replica.

use std::collections::HashMap;

use futures_util::{SinkExt, StreamExt};
use laned_testkit::fixtures::{self, Layout, TdnnConfig};
use tokio_tungstenite::tungstenite::Message;

use super::save;
use super::serve::{checked_spec, noise_pulses, serve, solo};
use laned_server::testing::Redis;

type Ws = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// A record as the docs give it: kind, tag (u32 LE), length (u32 LE),
/// payload.
pub fn record(kind: u8, tag: u32, payload: &[u8]) -> Vec<u8> {
    let mut r = vec![kind];
    r.extend_from_slice(&tag.to_le_bytes());
    r.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    r.extend_from_slice(payload);
    r
}

/// What the server said of one stream.
#[derive(Debug, Clone, PartialEq)]
enum Said {
    Opened(u64),
    Answer(u64, Vec<u8>),
    Closed(u16, String),
}

/// The records of one server message.
fn said(message: &[u8]) -> Vec<(u32, Said)> {
    let mut out = vec![];
    let mut rest = message;
    while !rest.is_empty() {
        let kind = rest[0];
        let tag = u32::from_le_bytes(rest[1..5].try_into().unwrap());
        let len = u32::from_le_bytes(rest[5..9].try_into().unwrap()) as usize;
        let p = &rest[9..9 + len];
        let u64_at = |b: &[u8]| u64::from_le_bytes(b[..8].try_into().unwrap());
        out.push((
            tag,
            match kind {
                0x81 => Said::Opened(u64_at(p)),
                0x82 => Said::Answer(u64_at(p), p[8..].to_vec()),
                0x83 => Said::Closed(
                    u16::from_le_bytes([p[0], p[1]]),
                    String::from_utf8_lossy(&p[2..]).into_owned(),
                ),
                other => panic!("a server record of kind {other}"),
            },
        ));
        rest = &rest[9 + len..];
    }
    out
}

/// A mux connection and its hello.
async fn connect(addr: &str, model: &str) -> (Ws, serde_json::Value) {
    let url = format!("ws://{addr}/v1/models/{model}/mux");
    let (mut ws, _) = tokio_tungstenite::connect_async(&url).await.unwrap();
    let hello = match ws.next().await.unwrap().unwrap() {
        Message::Text(t) => serde_json::from_str(&t).unwrap(),
        other => panic!("{other:?} where the hello was due"),
    };
    (ws, hello)
}

/// The next message's records; a close of the connection as tag
/// `u32::MAX`.
async fn next(ws: &mut Ws) -> Vec<(u32, Said)> {
    loop {
        match tokio::time::timeout(std::time::Duration::from_secs(30), ws.next())
            .await
            .expect("the server said nothing for 30 s")
        {
            Some(Ok(Message::Binary(b))) => return said(&b),
            Some(Ok(Message::Close(f))) => {
                let (code, why) = f.map_or((1005, String::new()), |f| (f.code.into(), f.reason.to_string()));
                return vec![(u32::MAX, Said::Closed(code, why))];
            }
            Some(Ok(_)) => continue,
            other => return vec![(u32::MAX, Said::Closed(1006, format!("{other:?}")))],
        }
    }
}

/// Sixteen streams of `model` on one connection, `pulses[s]` each, sent
/// several pulses a record and several streams a message; every stream's
/// answers, by tag, in order, with how many messages carried them.
async fn sixteen(addr: &str, model: &str, pulses: &[Vec<Vec<u8>>]) -> (HashMap<u32, Vec<Vec<u8>>>, usize) {
    let (mut ws, hello) = connect(addr, model).await;
    assert_eq!(hello["mux"], 1, "{hello}");
    let opens: Vec<u8> = (0..pulses.len() as u32).flat_map(|t| record(1, t, b"")).collect();
    ws.send(Message::Binary(opens.into())).await.unwrap();
    // Round k: pulses 2k and 2k+1 of every stream in one message.
    let rounds = pulses[0].len().div_ceil(2);
    for k in 0..rounds {
        let message: Vec<u8> = pulses
            .iter()
            .enumerate()
            .flat_map(|(t, p)| record(2, t as u32, &p[2 * k..(2 * k + 2).min(p.len())].concat()))
            .collect();
        ws.send(Message::Binary(message.into())).await.unwrap();
    }
    let want: usize = pulses.iter().map(Vec::len).sum();
    let (mut answers, mut got, mut messages) = (HashMap::<u32, Vec<Vec<u8>>>::new(), 0, 0);
    while got < want {
        let records = next(&mut ws).await;
        messages += 1;
        for (tag, s) in records {
            match s {
                Said::Opened(at) => assert_eq!(at, 0, "stream {tag}"),
                Said::Answer(n, bytes) => {
                    let a = answers.entry(tag).or_default();
                    assert_eq!(n, a.len() as u64, "stream {tag}: answers out of order");
                    a.push(bytes);
                    got += 1;
                }
                Said::Closed(code, why) => panic!("stream {tag} closed {code}: {why}"),
            }
        }
    }
    let ends: Vec<u8> = (0..pulses.len() as u32).flat_map(|t| record(3, t, b"")).collect();
    ws.send(Message::Binary(ends.into())).await.unwrap();
    let mut ended = 0;
    while ended < pulses.len() {
        for (tag, s) in next(&mut ws).await {
            assert_eq!(s, Said::Closed(1000, "ended by the client".into()), "stream {tag}");
            ended += 1;
        }
    }
    (answers, messages)
}

/// A GRU (its state a pair) and a pulsified conv stack, 16 streams each on
/// one connection, several pulses a record: every answer the model alone,
/// bit for bit, and fewer messages than answers (a turn's answers go out
/// together).
#[test]
fn sixteen_streams_on_one_connection_get_the_model_alone() {
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
    let runtime = tokio::runtime::Runtime::new().unwrap();
    for (model, spec, pairs) in [("gru", &gru_spec, vec![(1, 1)]), ("tdnn", &tdnn_spec, vec![])] {
        let (_, hello) = runtime.block_on(connect(&serving.addr, model));
        let bytes = hello["pulse_bytes"].as_u64().unwrap() as usize;
        let pulses: Vec<Vec<Vec<u8>>> = (0..16).map(|s| noise_pulses(50 + s, 9, bytes)).collect();
        let (answers, messages) = runtime.block_on(sixteen(&serving.addr, model, &pulses));
        for (s, p) in pulses.iter().enumerate() {
            let want = solo(spec, &pairs, p);
            assert_eq!(
                answers[&(s as u32)],
                want,
                "{model} stream {s} differs from the model alone"
            );
        }
        assert!(messages < 16 * 9, "{model}: {messages} messages for {} answers", 16 * 9);
    }
}

/// Bad records close only their stream: a pulse record not whole pulses
/// (1003, both lengths named), a pulse for a tag never opened and a tag
/// opened twice (1008); the other streams go on exact. A message that is
/// not whole records closes the connection 1003.
#[test]
fn bad_records_close_only_their_stream() {
    let dir = tempfile::tempdir().unwrap();
    let gru = save(&fixtures::gru_cell(8, 16).unwrap().model, dir.path(), "gru.nnef.tar");
    let spec = checked_spec(dir.path(), "gru.toml", &[&gru, "--state", "1=1"]);
    let serving = serve(&[&format!("gru={}", spec.display())]).unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let (mut ws, hello) = connect(&serving.addr, "gru").await;
        let bytes = hello["pulse_bytes"].as_u64().unwrap() as usize;
        assert_eq!(bytes, 32);
        let good: Vec<Vec<u8>> = noise_pulses(7, 4, bytes);
        let mut m: Vec<u8> = [0u32, 1, 2, 3].iter().flat_map(|t| record(1, *t, b"")).collect();
        m.extend(record(2, 0, &good[0]));
        m.extend(record(2, 1, &good[0][..bytes - 1]));
        m.extend(record(2, 9, &good[0]));
        m.extend(record(1, 2, b""));
        ws.send(Message::Binary(m.into())).await.unwrap();
        let mut closed = HashMap::new();
        let mut answers: Vec<Vec<u8>> = vec![];
        while closed.len() < 3 || answers.is_empty() {
            for (tag, s) in next(&mut ws).await {
                match s {
                    Said::Closed(code, why) => {
                        closed.insert(tag, (code, why));
                    }
                    Said::Answer(_, a) => {
                        assert_eq!(tag, 0);
                        answers.push(a);
                    }
                    Said::Opened(_) => {}
                }
            }
        }
        let (code, why) = &closed[&1];
        assert_eq!(*code, 1003, "{why}");
        assert!(why.contains("31 bytes") && why.contains("32-byte"), "{why}");
        assert_eq!(closed[&9].0, 1008, "{:?}", closed[&9]);
        assert_eq!(closed[&2].0, 1008, "{:?}", closed[&2]);
        assert!(!closed.contains_key(&0) && !closed.contains_key(&3), "{closed:?}");
        // Streams 0 and 3 go on, exact.
        let rest: Vec<u8> = [record(2, 0, &good[1..].concat()), record(2, 3, &good.concat())].concat();
        ws.send(Message::Binary(rest.into())).await.unwrap();
        let mut three = vec![];
        while answers.len() < 4 || three.len() < 4 {
            for (tag, s) in next(&mut ws).await {
                match (tag, s) {
                    (0, Said::Answer(_, a)) => answers.push(a),
                    (3, Said::Answer(_, a)) => three.push(a),
                    other => panic!("{other:?}"),
                }
            }
        }
        let want = solo(&spec, &[(1, 1)], &good);
        assert_eq!(answers, want);
        assert_eq!(three, want);
        // A record cut short: the framing is lost, the connection closed.
        ws.send(Message::Binary(record(2, 0, &good[0])[..20].to_vec().into()))
            .await
            .unwrap();
        let (tag, s) = next(&mut ws).await.remove(0);
        assert_eq!(tag, u32::MAX);
        assert!(
            matches!(&s, Said::Closed(1003, why) if why.contains("32 bytes of payload, 11 follow")),
            "{s:?}"
        );
    });
}

/// Eight streams with ids on one connection to replica A; A told SIGTERM
/// mid-stream: each is handed over (1012, its chunk named), reopened on
/// replica B by its id on another connection, resent from the position
/// B's opening says; every answer, both replicas' together, the model's
/// alone.
#[test]
fn a_rolling_restart_hands_every_multiplexed_stream_over() {
    let Some(redis) = Redis::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let config = TdnnConfig {
        width: 8,
        pulse: 4,
        layout: Layout::Nchw,
    };
    let tdnn = save(&fixtures::tdnn_streaming(config).unwrap(), dir.path(), "tdnn.nnef.tar");
    let spec = checked_spec(dir.path(), "tdnn.toml", &[&tdnn, "--pulse", "4"]);
    let args = |url: &str| vec![format!("tdnn={}", spec.display()), "--store".into(), url.to_string()];
    let a = serve(&args(&redis.url()).iter().map(String::as_str).collect::<Vec<_>>()).unwrap();
    let b = serve(&args(&redis.url()).iter().map(String::as_str).collect::<Vec<_>>()).unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (bytes, pulses) = runtime.block_on(async {
        let (_, hello) = connect(&a.addr, "tdnn").await;
        let bytes = hello["pulse_bytes"].as_u64().unwrap() as usize;
        (
            bytes,
            (0..8).map(|s| noise_pulses(90 + s, 12, bytes)).collect::<Vec<_>>(),
        )
    });
    assert!(bytes > 0);
    let answers = runtime.block_on(async {
        let (mut ws, _) = connect(&a.addr, "tdnn").await;
        let opens: Vec<u8> = (0..8u32)
            .flat_map(|t| record(1, t, format!("mux-call-{t}").as_bytes()))
            .collect();
        ws.send(Message::Binary(opens.into())).await.unwrap();
        let mut answers: Vec<Vec<Vec<u8>>> = vec![vec![]; 8];
        // Five pulses each on A, answered.
        let five: Vec<u8> = (0..8)
            .flat_map(|t| record(2, t as u32, &pulses[t][..5].concat()))
            .collect();
        ws.send(Message::Binary(five.into())).await.unwrap();
        while answers.iter().map(Vec::len).sum::<usize>() < 40 {
            for (tag, s) in next(&mut ws).await {
                match s {
                    Said::Answer(n, x) => {
                        assert_eq!(n as usize, answers[tag as usize].len());
                        answers[tag as usize].push(x);
                    }
                    Said::Opened(at) => assert_eq!(at, 0),
                    other => panic!("stream {tag}: {other:?}"),
                }
            }
        }
        a.terminate();
        let mut resume_at = HashMap::new();
        while resume_at.len() < 8 {
            for (tag, s) in next(&mut ws).await {
                match s {
                    Said::Closed(1012, why) => {
                        let at: u64 = why
                            .rsplit(' ')
                            .next()
                            .unwrap()
                            .parse()
                            .unwrap_or_else(|_| panic!("{why}"));
                        resume_at.insert(tag, at);
                    }
                    other if tag == u32::MAX => panic!("the connection ended first: {other:?}"),
                    other => panic!("stream {tag}: {other:?}"),
                }
            }
        }
        // On B, another connection: each id reopened where it was left.
        let (mut wb, _) = connect(&b.addr, "tdnn").await;
        let opens: Vec<u8> = (0..8u32)
            .flat_map(|t| record(1, t, format!("mux-call-{t}").as_bytes()))
            .collect();
        wb.send(Message::Binary(opens.into())).await.unwrap();
        let mut opened = HashMap::new();
        while opened.len() < 8 {
            for (tag, s) in next(&mut wb).await {
                match s {
                    Said::Opened(at) => {
                        opened.insert(tag, at);
                    }
                    other => panic!("stream {tag}: {other:?}"),
                }
            }
        }
        assert_eq!(opened, resume_at, "B resumes each stream where A said");
        for (t, at) in &opened {
            answers[*t as usize].truncate(*at as usize);
        }
        let rest: Vec<u8> = (0..8)
            .flat_map(|t| record(2, t as u32, &pulses[t][opened[&(t as u32)] as usize..].concat()))
            .collect();
        wb.send(Message::Binary(rest.into())).await.unwrap();
        while answers.iter().map(Vec::len).sum::<usize>() < 8 * 12 {
            for (tag, s) in next(&mut wb).await {
                match s {
                    Said::Answer(n, x) => {
                        assert_eq!(n as usize, answers[tag as usize].len(), "stream {tag}");
                        answers[tag as usize].push(x);
                    }
                    other => panic!("stream {tag}: {other:?}"),
                }
            }
        }
        answers
    });
    for (s, got) in answers.iter().enumerate() {
        assert!(
            got == &solo(&spec, &[], &pulses[s]),
            "stream {s} differs from the model alone across the restart"
        );
    }
}

/// A GRU (its state a pair) of `features` inputs served alone; its spec.
fn gru_served(dir: &std::path::Path, features: usize) -> (super::serve::Serving, std::path::PathBuf) {
    let gru = save(&fixtures::gru_cell(features, 16).unwrap().model, dir, "gru.nnef.tar");
    let spec = checked_spec(dir, "gru.toml", &[&gru, "--state", "1=1"]);
    let serving = serve(&[&format!("gru={}", spec.display())]).unwrap();
    (serving, spec)
}

/// Reads the server's records, each given to `each`, until it says every
/// one it wanted came; the connection's end fails the test.
async fn read_until(ws: &mut Ws, mut each: impl FnMut(u32, Said) -> bool) {
    loop {
        for (tag, s) in next(ws).await {
            if tag == u32::MAX {
                panic!("the connection ended: {s:?}");
            }
            if each(tag, s) {
                return;
            }
        }
    }
}

/// The hello states the bounds (256 streams, 64 queued pulses); 256
/// streams open, a 257th open is refused 1013 naming the bound and no
/// other stream is touched: three of them then get their pulses' answers,
/// the model alone; one ended, the refused tag opens and is served.
#[test]
fn past_256_streams_an_open_is_refused_and_the_others_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let (serving, spec) = gru_served(dir.path(), 8);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let (mut ws, hello) = connect(&serving.addr, "gru").await;
        assert_eq!(hello["max_streams"], 256, "{hello}");
        assert_eq!(hello["max_queued"], 64, "{hello}");
        let opens: Vec<u8> = (0..=256u32).flat_map(|t| record(1, t, b"")).collect();
        ws.send(Message::Binary(opens.into())).await.unwrap();
        let (mut opened, mut refused) = (0, None);
        read_until(&mut ws, |tag, s| {
            match s {
                Said::Opened(0) => opened += 1,
                Said::Closed(code, why) => refused = Some((tag, code, why)),
                other => panic!("stream {tag}: {other:?}"),
            }
            opened == 256 && refused.is_some()
        })
        .await;
        let (tag, code, why) = refused.unwrap();
        assert_eq!((tag, code), (256, 1013), "{why}");
        assert!(why.contains("256 streams open on this connection"), "{why}");
        let pulses: Vec<Vec<u8>> = noise_pulses(11, 4, 32);
        let want = solo(&spec, &[(1, 1)], &pulses);
        let m: Vec<u8> = [0u32, 128, 255]
            .iter()
            .flat_map(|t| record(2, *t, &pulses.concat()))
            .collect();
        ws.send(Message::Binary(m.into())).await.unwrap();
        let mut answers: HashMap<u32, Vec<Vec<u8>>> = HashMap::new();
        read_until(&mut ws, |tag, s| {
            match s {
                Said::Answer(n, a) => {
                    let got = answers.entry(tag).or_default();
                    assert_eq!(n as usize, got.len(), "stream {tag}");
                    got.push(a);
                }
                other => panic!("stream {tag}: {other:?}"),
            }
            answers.values().map(Vec::len).sum::<usize>() == 12
        })
        .await;
        for t in [0, 128, 255] {
            assert_eq!(answers[&t], want, "stream {t} differs from the model alone");
        }
        // One ended: its place taken by the tag refused before.
        let m = [record(3, 5, b""), record(1, 256, b""), record(2, 256, &pulses.concat())].concat();
        ws.send(Message::Binary(m.into())).await.unwrap();
        let (mut ended, mut late) = (false, vec![]);
        read_until(&mut ws, |tag, s| {
            match (tag, s) {
                (5, Said::Closed(1000, _)) => ended = true,
                (256, Said::Opened(0)) => {}
                (256, Said::Answer(_, a)) => late.push(a),
                other => panic!("{other:?}"),
            }
            ended && late.len() == 4
        })
        .await;
        assert_eq!(late, want, "the stream opened in a freed place");
    });
}

/// A stream sent more than 64 pulses before their answers is closed 1008
/// naming the bound, none of its pulses answered; 64 at once on another
/// stream are all served, and a third stream beside them, each the model
/// alone.
#[test]
fn past_64_queued_pulses_a_stream_is_closed_and_the_others_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let (serving, spec) = gru_served(dir.path(), 8);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let (mut ws, _) = connect(&serving.addr, "gru").await;
        let (full, over, small) = (
            noise_pulses(21, 64, 32),
            noise_pulses(22, 65, 32),
            noise_pulses(23, 3, 32),
        );
        let m = [
            record(1, 0, b""),
            record(1, 1, b""),
            record(1, 2, b""),
            record(2, 0, &full.concat()),
            record(2, 1, &over.concat()),
            record(2, 2, &small.concat()),
        ]
        .concat();
        ws.send(Message::Binary(m.into())).await.unwrap();
        let mut answers: HashMap<u32, Vec<Vec<u8>>> = HashMap::new();
        let mut closed = None;
        read_until(&mut ws, |tag, s| {
            match s {
                Said::Opened(0) => {}
                Said::Answer(n, a) => {
                    let got = answers.entry(tag).or_default();
                    assert_eq!(n as usize, got.len(), "stream {tag}");
                    got.push(a);
                }
                Said::Closed(code, why) => closed = Some((tag, code, why)),
                other => panic!("stream {tag}: {other:?}"),
            }
            closed.is_some() && answers.values().map(Vec::len).sum::<usize>() == 67
        })
        .await;
        let (tag, code, why) = closed.unwrap();
        assert_eq!((tag, code), (1, 1008), "{why}");
        assert!(why.contains("more than 64 pulses queued"), "{why}");
        assert!(!answers.contains_key(&1), "the closed stream was answered");
        assert_eq!(answers[&0], solo(&spec, &[(1, 1)], &full), "the full queue's stream");
        assert_eq!(answers[&2], solo(&spec, &[(1, 1)], &small), "the stream beside");
    });
}

/// Pulses of 8 KiB (a GRU of 2048 inputs): eight streams sent 64 pulses
/// each at once, 4 MiB, twice the connection's queue budget (four full
/// queues): past the budget the server leaves the messages unread until
/// answers free it, so nothing is closed and every pulse is answered, in
/// order, the model alone; a stream opened after is served at once.
#[test]
fn past_the_queue_budget_messages_wait_and_nothing_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let (serving, spec) = gru_served(dir.path(), 2048);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let (ws, hello) = connect(&serving.addr, "gru").await;
        let bytes = hello["pulse_bytes"].as_u64().unwrap() as usize;
        assert_eq!(bytes, 8192);
        let pulses: Vec<Vec<Vec<u8>>> = (0..8).map(|s| noise_pulses(30 + s, 64, bytes)).collect();
        let (mut sink, mut stream) = ws.split();
        let sending = async {
            let opens: Vec<u8> = (0..8u32).flat_map(|t| record(1, t, b"")).collect();
            sink.send(Message::Binary(opens.into())).await.unwrap();
            for (t, p) in pulses.iter().enumerate() {
                sink.send(Message::Binary(record(2, t as u32, &p.concat()).into()))
                    .await
                    .unwrap();
            }
            sink
        };
        let reading = async {
            let mut answers: Vec<Vec<Vec<u8>>> = vec![vec![]; 8];
            while answers.iter().map(Vec::len).sum::<usize>() < 8 * 64 {
                let m = tokio::time::timeout(std::time::Duration::from_secs(60), stream.next())
                    .await
                    .expect("the server said nothing for 60 s");
                let Some(Ok(Message::Binary(b))) = m else {
                    panic!("{m:?} where answers were due")
                };
                for (tag, s) in said(&b) {
                    match s {
                        Said::Opened(0) => {}
                        Said::Answer(n, a) => {
                            assert_eq!(n as usize, answers[tag as usize].len(), "stream {tag}");
                            answers[tag as usize].push(a);
                        }
                        other => panic!("stream {tag}: {other:?}"),
                    }
                }
            }
            answers
        };
        let (sink, answers) = tokio::join!(sending, reading);
        for (s, got) in answers.iter().enumerate() {
            assert!(
                got == &solo(&spec, &[(1, 1)], &pulses[s]),
                "stream {s} differs from the model alone"
            );
        }
        let mut ws = sink.reunite(stream).unwrap();
        let m = [record(1, 8, b""), record(2, 8, &pulses[0][0])].concat();
        ws.send(Message::Binary(m.into())).await.unwrap();
        read_until(&mut ws, |tag, s| match (tag, s) {
            (8, Said::Opened(0)) => false,
            (8, Said::Answer(0, a)) => {
                assert_eq!(a, solo(&spec, &[(1, 1)], &pulses[0][..1])[0]);
                true
            }
            other => panic!("{other:?}"),
        })
        .await;
    });
}

/// Open and end churned: 600 streams each opened, given a pulse and ended
/// in one message, beside a long stream. Every churned tag is closed
/// (1000; or 1013 naming the bound, where 256 ended streams' calls were
/// still running: those count until their call ends), any answer it got
/// the model's first; the long stream is never touched and stays exact.
/// Nothing piles up: once their calls ran out, 255 streams open beside
/// the long one and a 256th is refused 1013, as on a fresh connection.
#[test]
fn open_and_end_churn_piles_up_nothing_and_touches_no_other_stream() {
    let dir = tempfile::tempdir().unwrap();
    let (serving, spec) = gru_served(dir.path(), 8);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let (mut ws, _) = connect(&serving.addr, "gru").await;
        let long = noise_pulses(41, 8, 32);
        let churn = noise_pulses(42, 1, 32);
        let first = solo(&spec, &[(1, 1)], &churn).remove(0);
        let mut m = [record(1, 0, b""), record(2, 0, &long[..4].concat())].concat();
        for t in 1..=600u32 {
            m.extend(record(1, t, b""));
            m.extend(record(2, t, &churn[0]));
            m.extend(record(3, t, b""));
        }
        m.extend(record(2, 0, &long[4..].concat()));
        ws.send(Message::Binary(m.into())).await.unwrap();
        let (mut long_answers, mut closed) = (vec![], HashMap::new());
        read_until(&mut ws, |tag, s| {
            match (tag, s) {
                (0, Said::Answer(n, a)) => {
                    assert_eq!(n as usize, long_answers.len());
                    long_answers.push(a);
                }
                (0, other) if other != Said::Opened(0) => panic!("the long stream: {other:?}"),
                (_, Said::Answer(0, a)) => assert_eq!(a, first, "stream {tag}"),
                (_, Said::Closed(code, why)) => {
                    assert!(
                        code == 1000 || (code == 1013 && why.contains("256 streams")),
                        "stream {tag}: {code} {why}"
                    );
                    assert!(closed.insert(tag, code).is_none(), "stream {tag} closed twice");
                }
                _ => {}
            }
            long_answers.len() == 8 && closed.len() == 600
        })
        .await;
        assert_eq!(long_answers, solo(&spec, &[(1, 1)], &long), "the long stream");
        assert!(closed.values().any(|c| *c == 1000), "no churned stream was served");
        // Opened one at a time (an open refused while churned calls still
        // run is tried again): 255 fit beside the long stream, no more.
        for t in 10_000..10_256u32 {
            let mut tries = 0;
            loop {
                ws.send(Message::Binary(record(1, t, b"").into())).await.unwrap();
                let mut got = None;
                read_until(&mut ws, |tag, s| {
                    assert_eq!(tag, t, "{s:?}");
                    got = Some(s);
                    true
                })
                .await;
                match got.unwrap() {
                    Said::Opened(0) if t < 10_255 => break,
                    Said::Closed(1013, why) if t == 10_255 => {
                        assert!(why.contains("256 streams"), "{why}");
                        break;
                    }
                    Said::Closed(1013, _) if tries < 100 => {
                        tries += 1;
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    }
                    other => panic!("stream {t}: {other:?}"),
                }
            }
        }
        let m = record(2, 10_000, &churn[0]);
        ws.send(Message::Binary(m.into())).await.unwrap();
        read_until(&mut ws, |tag, s| match (tag, s) {
            (10_000, Said::Answer(0, a)) => {
                assert_eq!(a, first);
                true
            }
            other => panic!("{other:?}"),
        })
        .await;
    });
}

/// One message of END records for tags never opened drew a CLOSED record
/// each (8,700 of them, 78 KB, drew 357 KB). Now each tag not open is said closed
/// once a message, and a message naming more than 256 is refused: the
/// connection closed 1008 naming the bound, at most 256 CLOSED records
/// before it. A message naming the same unopened tag 1,000 times draws
/// one.
#[test]
fn a_message_of_ends_for_unopened_tags_draws_a_bounded_reply() {
    let dir = tempfile::tempdir().unwrap();
    let (serving, _) = gru_served(dir.path(), 8);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let (mut ws, _) = connect(&serving.addr, "gru").await;
        let same: Vec<u8> = (0..1000).flat_map(|_| record(3, 7, b"")).collect();
        ws.send(Message::Binary(same.into())).await.unwrap();
        let said = next(&mut ws).await;
        assert_eq!(said.len(), 1, "records drawn by one unopened tag: {:?}", said.first());
        assert!(
            matches!(&said[0], (7, Said::Closed(1008, why)) if why.contains("not open")),
            "{said:?}"
        );
        // 4,000 tags (36 KB: a message within this GRU's limit).
        let ends: Vec<u8> = (1000..5000u32).flat_map(|t| record(3, t, b"")).collect();
        ws.send(Message::Binary(ends.into())).await.unwrap();
        let mut closed = 0;
        loop {
            let said = next(&mut ws).await;
            for (tag, s) in said {
                match s {
                    Said::Closed(1008, why) if tag == u32::MAX => {
                        assert!(why.contains("more than 256 tags not open"), "{why}");
                        assert!(closed <= 257, "{closed} CLOSED records before the connection's close");
                        return;
                    }
                    Said::Closed(1008, _) => closed += 1,
                    other => panic!("tag {tag}: {other:?}"),
                }
            }
            assert!(closed <= 257, "{closed} CLOSED records and the connection still open");
        }
    });
}
