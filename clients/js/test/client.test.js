// The client against a real `laned serve`, started by the Rust test
// `laned/tests/laned/js.rs` (cargo nextest run -p laned -E 'test(js::)'),
// which passes in the environment where the servers listen and the files
// of pulses and the answers the model alone gives them:
//
//   LANED_URL          ws://HOST:PORT of a server of `gru` (a GRU: x f32
//                      [1, 8] in, y f32 [1, 16] out, its state kept) and
//                      `audio` (a GRU fed 16 kHz audio: hop 8, context 4)
//   LANED_BUSY_URL     ws://HOST:PORT of a server of `gru` with one lane and
//                      an admission wait of 200 ms
//   LANED_RESUME_URL   ws://HOST:PORT of a proxy to a replica of `gru` with a
//                      store, and behind it a second one sharing the store
//   LANED_RESUME_PID   the first replica's process id (this test stops it)
//   LANED_PULSES       raw f32 pulses for `gru` (32 bytes each)
//   LANED_ANSWERS      the model's answers to them (64 bytes each)
//   LANED_SAMPLES      raw f32 samples for `audio`
//   LANED_AUDIO_ANSWERS  `laned client`'s answers to them, as a WAV

import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import net from "node:net";
import WebSocket from "ws";

import {
  Busy,
  Closed,
  ConnectFailed,
  GoingAway,
  Hello,
  InputError,
  LanedError,
  PulseCutter,
  Refused,
  UnknownModel,
  UpgradeFailed,
  connect,
  cutPulses,
  streamAll,
} from "../laned.js";

const env = (name) => {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set: run these tests through laned/tests/laned/js.rs`);
  return value;
};

const base = () => env("LANED_URL");
const gruUrl = () => `${base()}/v1/models/gru/stream`;
const options = { WebSocket };

// A raw file as `size`-byte pieces, each a Float32Array.
function pieces(path, size) {
  const bytes = readFileSync(path);
  assert.equal(bytes.length % size, 0, `${path}: ${bytes.length} bytes, not whole ${size}-byte pieces`);
  const out = [];
  for (let at = 0; at < bytes.length; at += size) {
    out.push(new Float32Array(bytes.buffer.slice(bytes.byteOffset + at, bytes.byteOffset + at + size)));
  }
  return out;
}

const bytesOf = (answers) => Buffer.concat(answers.flat().map((a) => Buffer.from(a.buffer, a.byteOffset, a.byteLength)));

test("a round trip: each answer is the model's alone, byte for byte; the hello read", async () => {
  const pulses = pieces(env("LANED_PULSES"), 32);
  const want = readFileSync(env("LANED_ANSWERS"));
  const s = await connect(gruUrl(), options);
  assert.equal(s.model, "gru");
  assert.equal(s.resume, 0);
  assert.equal(s.format, "binary");
  assert.equal(s.audio, null);
  assert.deepEqual(
    s.inputs.map((p) => [p.name, p.dtype, p.shape]),
    [["x", "f32", [1, 8]]],
  );
  assert.deepEqual(
    s.outputs.map((p) => [p.dtype, p.shape]),
    [["f32", [1, 16]]],
  );
  // Calls may overlap: the answers come in order.
  const answers = await Promise.all(pulses.map((p) => s.call(p)));
  await s.close();
  assert.ok(answers.every(([y]) => y instanceof Float32Array && y.length === 16));
  assert.ok(bytesOf(answers).equals(want), "the answers differ from the model run alone");
  // Closed by us: further calls are refused, and `ended` says it was us.
  assert.equal(await s.ended, null);
  await assert.rejects(s.call(pulses[0]), InputError);
});

test("JSON answers equal binary ones", async () => {
  const pulses = pieces(env("LANED_PULSES"), 32).slice(0, 8);
  // Non-finite input too (what the GRU makes of it, both ways alike).
  pulses.push(new Float32Array(8).fill(NaN), new Float32Array(8).fill(-Infinity));
  const binary = await streamAll(gruUrl(), pulses, options);
  const json = await streamAll(gruUrl(), pulses, { ...options, format: "json" });
  assert.equal(json.length, pulses.length);
  assert.ok(json.every(([y]) => y instanceof Float32Array && y.length === 16));
  // To the byte; a NaN as NaN (JSON's "NaN" keeps no payload).
  json.forEach(([y], k) => {
    const [b] = binary[k];
    const same = y.every((v, i) => Object.is(v, b[i]) || (Number.isNaN(v) && Number.isNaN(b[i])));
    assert.ok(same, `answer ${k}: ${y} (JSON) / ${b} (binary)`);
  });
  const s = await connect(gruUrl(), { ...options, format: "json" });
  assert.equal(s.format, "json");
  await s.close();
});

test("a JSON answer's non-finite values, named by strings, are read back; each output its typed array", () => {
  const port = (name, dtype, shape) => ({ index: 0, name, dtype, shape });
  const hello = new Hello(
    JSON.stringify({
      protocol: 1,
      model: "m",
      stream: null,
      resume: 0,
      format: "json",
      inputs: [port("x", "f32", [1, 1])],
      outputs: [port("y", "f32", [1, 4]), port("n", "i64", [1, 2]), port("b", "bool", [1, 2]), port("h", "f16", [1, 2])],
    }),
  );
  const [y, n, b, h] = hello.decode(
    JSON.stringify({ pulse: 0, outputs: [["NaN", "Infinity", "-Infinity", -0.5], [3, -4], [1, 0], [1, -2]] }),
  );
  assert.ok(y instanceof Float32Array && Number.isNaN(y[0]));
  assert.deepEqual(Array.from(y.subarray(1)), [Infinity, -Infinity, -0.5]);
  assert.deepEqual(n, new BigInt64Array([3n, -4n]));
  assert.deepEqual(b, new Uint8Array([1, 0]));
  assert.deepEqual(h, new Uint16Array([0x3c00, 0xc000]));
  assert.throws(() => hello.decode(JSON.stringify({ pulse: 0, outputs: [["nan", 0, 0, 0], [0, 0], [0, 0], [0, 0]] })), /"nan" is not a number/);
  assert.throws(() => hello.decode(JSON.stringify({ pulse: 0, outputs: [[0, 0, 0], [0, 0], [0, 0], [0, 0]] })), /output "y": 3 numbers, wanted 4/);
});

test("a pulse of the wrong length or type is refused naming the input; the server's refusal is Refused", async () => {
  const s = await connect(gruUrl(), options);
  await assert.rejects(s.call(new Float32Array(7)), (e) => {
    assert.ok(e instanceof InputError && e instanceof LanedError, e.name);
    assert.match(e.message, /input "x": 7 values, wanted 8/);
    return true;
  });
  await assert.rejects(s.call(new Float64Array(8)), /input "x": a Float64Array, wanted a Float32Array \(f32\)/);
  await assert.rejects(s.call(new Float32Array(8), new Float32Array(8)), /2 arrays for a model that takes 1 \("x"\)/);
  await assert.rejects(s.send(new Uint8Array(31)), /a pulse is 32 bytes, got 31/);
  // The stream is still good after the client's refusals.
  const [y] = await s.call(new Float32Array(8));
  assert.equal(y.length, 16);
  // A frame of 31 bytes past the client's checks: the server closes 1003,
  // naming both lengths.
  s.ws.send(new Uint8Array(31));
  const ended = await s.ended;
  assert.ok(ended instanceof Refused && ended instanceof Closed, `${ended}`);
  assert.equal(ended.code, 1003);
  assert.equal(ended.exitStatus, 5);
  assert.match(ended.reason, /32/);
  assert.match(ended.reason, /31/);
  await assert.rejects(s.call(new Float32Array(8)), Refused);
});

test("an unknown model is a failed upgrade: UnknownModel, 404, the models named", async () => {
  await assert.rejects(connect(`${base()}/v1/models/nope/stream`, options), (e) => {
    assert.ok(e instanceof UnknownModel && e instanceof UpgradeFailed, `${e}`);
    assert.equal(e.status, 404);
    assert.match(e.body, /"nope"/);
    assert.match(e.body, /gru/);
    assert.equal(e.exitStatus, 5);
    return true;
  });
});

test("no server at the address is ConnectFailed", async () => {
  const free = await new Promise((resolve) => {
    const server = net.createServer().listen(0, "127.0.0.1", () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
  });
  await assert.rejects(connect(`ws://127.0.0.1:${free}/v1/models/gru/stream`, options), (e) => {
    assert.ok(e instanceof ConnectFailed, `${e}`);
    assert.equal(e.exitStatus, 1);
    return true;
  });
  // And a URL that never connected is not retried by streamAll.
  const started = Date.now();
  await assert.rejects(streamAll(`ws://127.0.0.1:${free}/v1/models/gru/stream`, [], options), ConnectFailed);
  assert.ok(Date.now() - started < 5000);
});

test("busy: the one lane held by a stream that has sent a pulse, the next stream's first pulse is Busy", async () => {
  const url = `${env("LANED_BUSY_URL")}/v1/models/gru/stream`;
  const holder = await connect(url, options);
  await holder.call(new Float32Array(8));
  // Connecting takes no lane: the hello comes at once.
  const late = await connect(url, options);
  await assert.rejects(late.call(new Float32Array(8)), (e) => {
    assert.ok(e instanceof Busy && e instanceof Closed, `${e}`);
    assert.equal(e.code, 1013);
    assert.equal(e.exitStatus, 3);
    assert.equal(e.resumable, false);
    return true;
  });
  assert.ok((await late.ended) instanceof Busy);
  // The holder goes on.
  const [y] = await holder.call(new Float32Array(8));
  assert.equal(y.length, 16);
  await holder.close();
});

test("audio: cut as the hello's framing says, the answers are laned client's for the same samples", async () => {
  const [samples] = pieces(env("LANED_SAMPLES"), readFileSync(env("LANED_SAMPLES")).length);
  const want = readFileSync(env("LANED_AUDIO_ANSWERS"));
  let seen = null;
  const answers = await streamAll(
    `${base()}/v1/models/audio/stream`,
    (s) => {
      seen = s.audio;
      return s.audio.cut(samples);
    },
    options,
  );
  assert.deepEqual([seen.sampleRate, seen.hop, seen.context, seen.pulseLength], [16000, 8, 4, 12]);
  assert.equal(answers.length, Math.ceil(samples.length / 8));
  assert.ok(bytesOf(answers).equals(want), "the answers differ from laned client's");
});

test("the cut: context from the pulse before, zeros before the start, the last pulse padded", () => {
  const samples = Float32Array.from({ length: 10 }, (_, k) => k + 1);
  const pulses = cutPulses(samples, { hop: 4, context: 2 });
  assert.deepEqual(
    pulses.map((p) => Array.from(p)),
    [
      [0, 0, 1, 2, 3, 4],
      [3, 4, 5, 6, 7, 8],
      [7, 8, 9, 10, 0, 0],
    ],
  );
  // Piece by piece, as a microphone gives it: the same pulses.
  const cutter = new PulseCutter({ hop: 4, context: 2 });
  const live = [];
  for (const piece of [samples.subarray(0, 3), samples.subarray(3, 3), samples.subarray(3, 9), samples.subarray(9)]) {
    live.push(...cutter.push(piece));
  }
  live.push(...cutter.flush());
  assert.deepEqual(live, pulses);
  assert.deepEqual(cutPulses(new Float32Array(8), { hop: 4 }).length, 2);
  assert.deepEqual(cutPulses(new Float32Array(0), { hop: 4 }).length, 0);
});

test("resume: a replica stopped mid-stream, the stream goes on from the next one's resume, exact", async () => {
  const pulses = pieces(env("LANED_PULSES"), 32);
  const want = readFileSync(env("LANED_ANSWERS"));
  const pid = Number(env("LANED_RESUME_PID"));
  const events = [];
  const id = `js-resume-${process.pid}`;
  const answers = await streamAll(`${env("LANED_RESUME_URL")}/v1/models/gru/stream`, pulses, {
    ...options,
    stream: id,
    everyMs: 20,
    onAnswer: (k) => {
      if (k === 5) process.kill(pid, "SIGTERM");
    },
    onEvent: (line) => events.push(line),
  });
  assert.ok(events.length > 0, "the stream was never interrupted");
  assert.ok(
    events.some((e) => e.includes("closed 1012")),
    `no 1012 among ${JSON.stringify(events)}`,
  );
  assert.ok(bytesOf(answers).equals(want), `the answers differ from the model run alone (${events})`);
});

test("every close code is its class", () => {
  const cases = [
    [1001, GoingAway, 4, false],
    [1012, GoingAway, 4, true],
    [1003, Refused, 5, false],
    [1008, Refused, 5, false],
    [1009, Refused, 5, false],
    [1013, Busy, 3, false],
    [1011, Closed, 6, false],
    [4000, Closed, 6, false],
    [1006, Closed, 1, true],
  ];
  for (const [code, Class, status, resumable] of cases) {
    const e = Closed.of(code, "why");
    assert.ok(e instanceof Class, `${code}: ${e.name}`);
    assert.equal(e.exitStatus, status, `${code}`);
    assert.equal(e.resumable, resumable, `${code}`);
    assert.equal(e.code, code);
  }
  assert.equal(Closed.of(1011).name, "ServerError");
  assert.equal(Closed.of(1006).name, "ConnectionLost");
});
