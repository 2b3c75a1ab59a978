//! The multiplexed front's wire format: many streams of one model on one
//! WebSocket (`GET /v1/models/NAME/mux`), for a gateway carrying many
//! calls (a telephony media server, an agent worker) that should not pay
//! a socket and a frame per pulse per call. Mux version [`MUX_VERSION`]:
//!
//! 1. After the upgrade the server sends one text message, the hello:
//!    `{"protocol": 1, "mux": 1, "model": NAME, "inputs": [PORT...],
//!    "outputs": [PORT...], "pulse_bytes": P, "answer_bytes": A,
//!    "max_streams": S, "max_queued": Q, "max_message_bytes": M}` (ports
//!    as the single-stream hello's, and its `"audio"` where the model has
//!    one). `M` bounds each message the client sends; the server's
//!    messages are at most [`MAX_OUT_MESSAGE`] bytes, or one record where
//!    a record is longer.
//! 2. Every binary message, either way, is a sequence of records, one
//!    after another, each:
//!
//!    | bytes | field |
//!    |---|---|
//!    | 1 | `kind` |
//!    | 4 | `tag`, u32 little-endian: the client's number for the stream on this connection |
//!    | 4 | `len`, u32 little-endian: the payload's length |
//!    | `len` | the payload |
//!
//! 3. The client's records:
//!    - [`OPEN`] (1): open stream `tag`; the payload is its id (UTF-8, as
//!      `x-stream-id`; empty: none, so no hand-over). Answered
//!      [`OPENED`].
//!    - [`PULSE`] (2): one or more pulses of stream `tag`, `P` bytes each
//!      (every fed input in order, little-endian, as on the single-stream
//!      front), served in order. A stream takes its lane at its first
//!      pulse.
//!    - [`END`] (3): the client ends stream `tag` (its record removed, as
//!      a clean close does); answered [`CLOSED`] 1000. Empty payload.
//! 4. The server's records:
//!    - [`OPENED`] (0x81): payload a u64 little-endian, the pulse the
//!      stream resumes from (0 for a fresh one): resend from there. Pulses
//!      sent before it are counted from that position: a client resuming
//!      waits for it.
//!    - [`ANSWER`] (0x82): payload a u64 little-endian, the pulse's number
//!      on the stream, then `A` bytes, every output in order. Every answer
//!      ready at once (a turn's, for this connection) goes in one message.
//!    - [`CLOSED`] (0x83): payload a u16 little-endian close code, then the
//!      reason in UTF-8: stream `tag` is over (its tag may be opened
//!      again). The codes are the single-stream front's close codes, per
//!      stream: 1000 ended by the client; 1003 a pulse record not whole
//!      pulses (both lengths named); 1001 the runner closed (a stream
//!      without an id, during a shutdown); 1008 a tag not open, opened
//!      twice, an id live elsewhere or not an id, more than `Q` pulses
//!      queued, or no pulse for the idle time; 1011 the model failed; 1012
//!      the server is restarting (reopen the id on any replica, resending
//!      from the position its opened record gives; the reason names it
//!      where the stream had one); 1013 more than `S` streams on the
//!      connection (those closed while a call of theirs runs count until
//!      it ends), or no lane freed up within the admission wait.
//! 5. Whole-connection closes: a message that is not whole records, an
//!    unknown kind or a text message (1003), a message over `M` (1009), a
//!    message naming more than `S` tags not open (1008: each such tag is
//!    said closed once a message, so a message's replies stay bounded), no
//!    stream open for the idle time (1008), the server shutting down
//!    (1001), and, during a drain, once every stream is handed over or
//!    gone (1012). While the pulses queued on a connection pass
//!    [`queue_budget`] bytes, its messages are left unread.
//!
//! The session's own life (when lanes are taken, the clocks, the drain) is
//! the server's; this module is the bytes, shared by the server, the tests
//! and the bench.

/// The version the hello's `"mux"` announces.
pub const MUX_VERSION: u32 = 1;

/// Open stream `tag` (payload: its id, or empty).
pub const OPEN: u8 = 1;
/// Pulses of stream `tag` (payload: whole pulses).
pub const PULSE: u8 = 2;
/// The client ends stream `tag` (empty payload).
pub const END: u8 = 3;
/// Stream `tag` is open (payload: the u64 pulse it resumes from).
pub const OPENED: u8 = 0x81;
/// An answer (payload: the u64 pulse number, then the answer's bytes).
pub const ANSWER: u8 = 0x82;
/// Stream `tag` is over (payload: the u16 close code, then the reason).
pub const CLOSED: u8 = 0x83;

/// A record's header: kind, tag, length.
pub const HEADER_BYTES: usize = 9;

/// Streams one connection may hold open at once.
pub const MAX_STREAMS: usize = 256;

/// Pulses a stream may have queued (received, not yet answered).
pub const MAX_QUEUED: usize = 64;

/// The most bytes of records the server puts in one message (a longer
/// record goes alone).
pub const MAX_OUT_MESSAGE: usize = 256 << 10;

/// Bytes of an open record with the longest id.
const MAX_OPEN_RECORD: usize = HEADER_BYTES + 128;

/// One record, as read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record<'a> {
    /// Its kind ([`OPEN`], [`PULSE`], ...).
    pub kind: u8,
    /// The stream's tag on its connection.
    pub tag: u32,
    /// Its payload.
    pub payload: &'a [u8],
}

/// Appends one record to `out`.
pub fn put(out: &mut Vec<u8>, kind: u8, tag: u32, payload: &[&[u8]]) {
    let len: usize = payload.iter().map(|p| p.len()).sum();
    out.push(kind);
    out.extend_from_slice(&tag.to_le_bytes());
    out.extend_from_slice(&(len as u32).to_le_bytes());
    for p in payload {
        out.extend_from_slice(p);
    }
}

/// Every record of `message`, in order; `Err` naming where it stops being
/// whole records (the message is then refused whole: its framing is lost).
pub fn records(message: &[u8]) -> Result<Vec<Record<'_>>, RecordsError> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < message.len() {
        let rest = &message[at..];
        if rest.len() < HEADER_BYTES {
            return Err(RecordsError::HeaderCut { at, left: rest.len() });
        }
        let kind = rest[0];
        let tag = u32::from_le_bytes(rest[1..5].try_into().expect("four bytes"));
        let len = u32::from_le_bytes(rest[5..9].try_into().expect("four bytes")) as usize;
        if rest.len() - HEADER_BYTES < len {
            return Err(RecordsError::PayloadCut {
                record: out.len(),
                tag,
                says: len,
                follow: rest.len() - HEADER_BYTES,
            });
        }
        out.push(Record {
            kind,
            tag,
            payload: &rest[HEADER_BYTES..HEADER_BYTES + len],
        });
        at += HEADER_BYTES + len;
    }
    Ok(out)
}

/// Why a message is not whole records ([`records`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RecordsError {
    /// Fewer than [`HEADER_BYTES`] bytes left after the last whole record.
    HeaderCut {
        /// Where the cut header starts, in bytes from the message's start.
        at: usize,
        /// The bytes left there.
        left: usize,
    },
    /// A record's length says more bytes than the message holds.
    PayloadCut {
        /// The record's number in the message, from 0.
        record: usize,
        /// Its tag.
        tag: u32,
        /// The payload's length its header says.
        says: usize,
        /// The bytes that follow its header.
        follow: usize,
    },
}

impl std::fmt::Display for RecordsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RecordsError::HeaderCut { at, left } => write!(
                f,
                "a record cut short at byte {at}: {left} bytes, a header is {HEADER_BYTES}"
            ),
            RecordsError::PayloadCut {
                record,
                tag,
                says,
                follow,
            } => write!(
                f,
                "record {record} (tag {tag}) says {says} bytes of payload, {follow} follow"
            ),
        }
    }
}

impl std::error::Error for RecordsError {}

/// The largest message a client of a model with `pulse_bytes`-byte pulses
/// may send: every stream opened with the longest id and one pulse each,
/// or one stream's queue full, whichever is more.
pub fn max_message_bytes(pulse_bytes: usize) -> usize {
    let one_queue = HEADER_BYTES + MAX_QUEUED * pulse_bytes;
    (MAX_STREAMS * (MAX_OPEN_RECORD + HEADER_BYTES + pulse_bytes)).max(one_queue)
}

/// The pulses' bytes a connection may hold queued before its messages are
/// left unread: four full queues, or 1 MiB, whichever is more.
pub fn queue_budget(pulse_bytes: usize) -> usize {
    (4 * MAX_QUEUED * pulse_bytes).max(1 << 20)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records read back as written, several to a message; a message cut
    /// anywhere inside a record is refused, naming where.
    #[test]
    fn records_read_back_and_a_cut_one_is_refused() {
        let mut m = Vec::new();
        put(&mut m, OPEN, 7, &[b"call-7"]);
        put(&mut m, PULSE, 7, &[&[1, 2], &[3, 4]]);
        put(&mut m, END, u32::MAX, &[]);
        let got = records(&m).unwrap();
        assert_eq!(
            got,
            vec![
                Record {
                    kind: OPEN,
                    tag: 7,
                    payload: b"call-7"
                },
                Record {
                    kind: PULSE,
                    tag: 7,
                    payload: &[1, 2, 3, 4]
                },
                Record {
                    kind: END,
                    tag: u32::MAX,
                    payload: &[]
                },
            ]
        );
        for cut in 1..m.len() {
            let whole = [HEADER_BYTES + 6, 2 * HEADER_BYTES + 10, m.len()];
            if !whole.contains(&cut) {
                assert!(records(&m[..cut]).is_err(), "cut at {cut} read as whole");
            }
        }
    }

    /// Each refusal names what was wrong: a header cut short (where, and
    /// how many bytes were left), a payload longer than what follows
    /// (which record, its tag, both lengths).
    #[test]
    fn a_bad_message_is_refused_naming_what_was_wrong() {
        let mut m = Vec::new();
        put(&mut m, OPENED, 3, &[&5u64.to_le_bytes()]);
        let header_cut = records(&[&m[..], &[ANSWER, 1, 0]].concat()).unwrap_err();
        assert_eq!(header_cut, RecordsError::HeaderCut { at: m.len(), left: 3 });
        assert_eq!(
            header_cut.to_string(),
            format!("a record cut short at byte {}: 3 bytes, a header is 9", m.len())
        );
        let mut long = m.clone();
        long.extend([CLOSED, 9, 0, 0, 0, 40, 0, 0, 0]);
        long.extend(1000u16.to_le_bytes());
        let payload_cut = records(&long).unwrap_err();
        assert_eq!(
            payload_cut,
            RecordsError::PayloadCut {
                record: 1,
                tag: 9,
                says: 40,
                follow: 2
            }
        );
        assert_eq!(
            payload_cut.to_string(),
            "record 1 (tag 9) says 40 bytes of payload, 2 follow"
        );
    }

    /// The server's records read back: an opened position, an answer's
    /// number and bytes, a close code and its reason.
    #[test]
    fn the_servers_records_round_trip() {
        let mut m = Vec::new();
        put(&mut m, OPENED, 1, &[&12u64.to_le_bytes()]);
        put(&mut m, ANSWER, 1, &[&12u64.to_le_bytes(), &[9, 8, 7]]);
        put(
            &mut m,
            CLOSED,
            1,
            &[&crate::close::RESTART.to_le_bytes(), b"restarting"],
        );
        let r = records(&m).unwrap();
        assert_eq!(
            r.iter().map(|r| (r.kind, r.tag)).collect::<Vec<_>>(),
            [(OPENED, 1), (ANSWER, 1), (CLOSED, 1)]
        );
        assert_eq!(u64::from_le_bytes(r[0].payload.try_into().unwrap()), 12);
        assert_eq!(&r[1].payload[8..], &[9, 8, 7]);
        assert_eq!(
            u16::from_le_bytes([r[2].payload[0], r[2].payload[1]]),
            crate::close::RESTART
        );
        assert_eq!(&r[2].payload[2..], b"restarting");
        assert_eq!(records(&[]).unwrap(), vec![]);
    }
}
