// laned.js: a client for `laned serve`'s tensor protocol, version 1
// (wire/src/tensor.rs has it byte for byte; docs/serve.md, "A stream").
// One ES module, no dependencies, no build step: browsers, and Node 20
// given a WebSocket constructor (the `ws` package's) as an option.
//
//   const stream = await connect("ws://127.0.0.1:8080/v1/models/vad/stream");
//   const [p] = await stream.call(new Float32Array(576));
//   await stream.close();
//
// Every way a stream ends early is one of the error classes below, by the
// close code as `laned client` and the Python client class them.

/** The protocol version this client speaks (the hello's `protocol`). */
export const PROTOCOL = 1;

// ---------------------------------------------------------------- errors

/** Anything that ends a stream of `laned serve` early. `exitStatus` is the
 * status `laned client` exits with for it. */
export class LanedError extends Error {
  get name() {
    return this.constructor.name;
  }
}
LanedError.prototype.exitStatus = 6;

/** No connection was made (refused, unresolved, timed out). */
export class ConnectFailed extends LanedError {
  constructor(url, why) {
    super(`${url}: no connection: ${why}`);
    this.url = url;
    this.why = why;
  }
}
ConnectFailed.prototype.exitStatus = 1;

/** The caller's input is unusable: the wrong count of arrays, an array of
 * the wrong type or length, a stream already closed. */
export class InputError extends LanedError {}
InputError.prototype.exitStatus = 2;

/** The server said something this client cannot follow. */
export class ProtocolError extends LanedError {}

/** The server answered the WebSocket upgrade with an HTTP refusal.
 * `status` and `body` are what it answered, where the environment tells
 * (Node with `ws`); a browser tells nothing of a failed upgrade, so there
 * they are `null` (no server, an unknown model and the connection cap look
 * the same). */
export class UpgradeFailed extends LanedError {
  constructor(url, status = null, body = null) {
    super(
      status === null
        ? `${url}: the WebSocket upgrade failed (this environment does not say why: no server, an unknown model or the connection cap)`
        : `${url}: HTTP ${status}: ${body}`,
    );
    this.url = url;
    this.status = status;
    this.body = body;
  }

  /** The class for `status`: 404 `UnknownModel`, 503 `Unavailable`. */
  static of(url, status, body) {
    const Class = status === 404 ? UnknownModel : status === 503 ? Unavailable : UpgradeFailed;
    return new Class(url, status, body);
  }
}
UpgradeFailed.prototype.exitStatus = 5;

/** 404: no model of that name here (the body names those served). */
export class UnknownModel extends UpgradeFailed {}

/** 503: the server's connection cap is reached; retry later. */
export class Unavailable extends UpgradeFailed {}
Unavailable.prototype.exitStatus = 3;

/** The stream was closed by the server, or dropped: `code` and `reason`
 * from the close frame (1006: none came). */
export class Closed extends LanedError {
  constructor(code, reason = "") {
    super(reason ? `closed ${code}: ${reason}` : `closed ${code}`);
    this.code = code;
    this.reason = reason;
  }

  /** Whether reconnecting with the same stream id may go on with the
   * stream: 1012 (the server restarts, the stream handed over) and 1006
   * (the connection dropped). */
  get resumable() {
    return this.code === 1012 || this.code === 1006;
  }

  /** The class of close `code`, as `laned client` classes it. */
  static of(code, reason = "") {
    if (code === 1006) return new ConnectionLost(reason);
    if (code === 1013) return new Busy(code, reason);
    if (code === 1001 || code === 1012) return new GoingAway(code, reason);
    if (code === 1003 || code === 1008 || code === 1009) return new Refused(code, reason);
    return new ServerError(code, reason);
  }
}

/** 1006: the connection dropped without a close frame. */
export class ConnectionLost extends Closed {
  constructor(reason = "") {
    super(1006, reason);
  }
}
ConnectionLost.prototype.exitStatus = 1;

/** 1013: no lane freed up within the server's admission wait. */
export class Busy extends Closed {}
Busy.prototype.exitStatus = 3;

/** 1001 (the server shuts down) or 1012 (it restarts and hands the stream
 * over: `resumable`). */
export class GoingAway extends Closed {}
GoingAway.prototype.exitStatus = 4;

/** 1003, 1008, 1009: the server refused what was sent (a frame not one
 * pulse, a text frame, an idle stream, an id live elsewhere). */
export class Refused extends Closed {}
Refused.prototype.exitStatus = 5;

/** 1011 and any other code: the server failed the stream. */
export class ServerError extends Closed {}

// ---------------------------------------------------------------- dtypes

const LITTLE = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;

// The element types on the wire, by the hello's names (tract's, lowercase):
// the typed array a value of it is, and its bytes. `f16` travels as its
// bits (a Uint16Array); `bool` one byte, non-zero true.
const DTYPES = {
  f32: [Float32Array, 4],
  f64: [Float64Array, 8],
  f16: [Uint16Array, 2],
  i8: [Int8Array, 1],
  i16: [Int16Array, 2],
  i32: [Int32Array, 4],
  i64: [BigInt64Array, 8],
  u8: [Uint8Array, 1],
  u16: [Uint16Array, 2],
  u32: [Uint32Array, 4],
  u64: [BigUint64Array, 8],
  bool: [Uint8Array, 1],
  // Quantized types go as their stored integers: `qi8(z:0 s:0.05)`.
  qi8: [Int8Array, 1],
  qu8: [Uint8Array, 1],
  qi32: [Int32Array, 4],
};

/** One fed input or one output as a stream sees it: the hello's `index`,
 * `name`, `dtype`, `shape`, and what follows: `size` (elements a pulse),
 * `bytes`, `ArrayType` (the typed array its values are). */
export class Port {
  constructor(p) {
    if (!p || typeof p.name !== "string" || typeof p.dtype !== "string" || !Array.isArray(p.shape)) {
      throw new ProtocolError(`a port of the hello, ${JSON.stringify(p)}, is not index, name, dtype, shape`);
    }
    const kind = DTYPES[p.dtype] ?? DTYPES[/^(qi8|qu8|qi32)\(/.exec(p.dtype)?.[1]];
    if (!kind) {
      throw new ProtocolError(`port "${p.name}": dtype "${p.dtype}" is unknown to this client`);
    }
    this.index = p.index;
    this.name = p.name;
    this.dtype = p.dtype;
    this.shape = p.shape.map(Number);
    [this.ArrayType, this.width] = kind;
    this.size = this.shape.reduce((a, b) => a * b, 1);
    this.bytes = this.size * this.width;
  }
}

// Reverses each `width`-byte element of `u8` in place (big-endian hosts).
function swap(u8, width) {
  if (LITTLE || width === 1) return;
  for (let at = 0; at < u8.length; at += width) u8.subarray(at, at + width).reverse();
}

// The bits of `x` as an IEEE half (round to nearest, ties to even).
function halfBits(x) {
  const f = new Float32Array([x]);
  const u = new Uint32Array(f.buffer)[0];
  const sign = (u >>> 16) & 0x8000;
  const exp = (u >>> 23) & 0xff;
  let man = u & 0x7fffff;
  if (exp === 0xff) return sign | 0x7c00 | (man ? 0x200 : 0);
  let e = exp - 127 + 15;
  if (e >= 0x1f) return sign | 0x7c00;
  if (e <= 0) {
    if (e < -10) return sign;
    man |= 0x800000;
    const shift = 14 - e;
    let half = man >>> shift;
    const rest = man & ((1 << shift) - 1);
    const mid = 1 << (shift - 1);
    if (rest > mid || (rest === mid && half & 1)) half++;
    return sign | half;
  }
  let half = (e << 10) | (man >>> 13);
  const rest = man & 0x1fff;
  if (rest > 0x1000 || (rest === 0x1000 && half & 1)) half++;
  return sign | half;
}

// ----------------------------------------------------------------- audio

/** How a model's pulses are cut from audio (the hello's `audio`): pulse k
 * is the `context` samples before sample k * `hop` (zeros before the
 * first), then `hop` new samples; the last pulse padded with zeros. */
export class Audio {
  constructor(a) {
    this.sampleRate = Number(a.sample_rate ?? a.sampleRate);
    this.hop = Number(a.hop);
    this.context = Number(a.context ?? 0);
    if (!(this.sampleRate > 0 && this.hop > 0 && this.context >= 0)) {
      throw new ProtocolError(`the hello's audio ${JSON.stringify(a)} is not sample_rate, hop, context`);
    }
  }

  /** Samples a pulse holds: `context` then `hop`. */
  get pulseLength() {
    return this.context + this.hop;
  }

  /** `samples` (a Float32Array, mono, at `sampleRate`) cut into pulses,
   * a Float32Array each: ceil(length / hop) of them. */
  cut(samples) {
    const cutter = new PulseCutter(this);
    return [...cutter.push(samples), ...cutter.flush()];
  }
}

/** `samples` cut as `audio` ({hop, context}) says: `Audio.cut`. */
export function cutPulses(samples, audio) {
  return new Audio({ sample_rate: 1, ...audio }).cut(samples);
}

/** The same cut a piece at a time, for a live source (a microphone):
 * `push(samples)` returns the pulses complete so far, `flush()` the last
 * one padded with zeros (none where no new sample is left). */
export class PulseCutter {
  constructor(audio) {
    this.hop = audio.hop;
    this.context = audio.context ?? 0;
    // The pulse being filled: its context first, zeros before the start.
    this.pulse = new Float32Array(this.context + this.hop);
    this.filled = this.context;
  }

  push(samples) {
    const out = [];
    let at = 0;
    while (at < samples.length) {
      const take = Math.min(samples.length - at, this.pulse.length - this.filled);
      this.pulse.set(samples.subarray(at, at + take), this.filled);
      this.filled += take;
      at += take;
      if (this.filled === this.pulse.length) out.push(this.next());
    }
    return out;
  }

  flush() {
    if (this.filled === this.context) return [];
    this.pulse.fill(0, this.filled);
    return [this.next()];
  }

  // The full pulse out; the next one begins with its last `context`.
  next() {
    const done = this.pulse;
    this.pulse = new Float32Array(done.length);
    this.pulse.set(done.subarray(done.length - this.context));
    this.filled = this.context;
    return done;
  }
}

// ----------------------------------------------------------------- hello

/** The server's hello: what the stream feeds and gets, and from where. */
export class Hello {
  constructor(text) {
    if (typeof text !== "string") {
      throw new ProtocolError(`a binary frame where the hello was due`);
    }
    let h;
    try {
      h = JSON.parse(text);
    } catch (e) {
      throw new ProtocolError(`the hello is not JSON (${e.message}): ${text.slice(0, 200)}`);
    }
    if (h?.protocol !== PROTOCOL) {
      throw new ProtocolError(`the server speaks protocol ${JSON.stringify(h?.protocol)}, this client ${PROTOCOL}`);
    }
    if (!Array.isArray(h.inputs) || !Array.isArray(h.outputs)) {
      throw new ProtocolError(`the hello lacks inputs or outputs: ${text.slice(0, 200)}`);
    }
    this.raw = h;
    this.model = h.model;
    this.streamId = h.stream ?? null;
    this.resume = Number(h.resume ?? 0);
    this.format = h.format ?? "binary";
    this.inputs = h.inputs.map((p) => new Port(p));
    this.outputs = h.outputs.map((p) => new Port(p));
    this.audio = h.audio ? new Audio(h.audio) : null;
    this.pulseBytes = this.inputs.reduce((n, p) => n + p.bytes, 0);
    this.answerBytes = this.outputs.reduce((n, p) => n + p.bytes, 0);
  }

  /** One pulse's bytes (an ArrayBuffer) from a typed array per fed input,
   * in order; each checked against its input's type and length. */
  encode(arrays) {
    if (arrays.length !== this.inputs.length) {
      const names = this.inputs.map((p) => `"${p.name}"`).join(", ");
      throw new InputError(`${arrays.length} arrays for a model that takes ${this.inputs.length} (${names})`);
    }
    const buffer = new ArrayBuffer(this.pulseBytes);
    let at = 0;
    this.inputs.forEach((port, k) => {
      const a = arrays[k];
      if (!(a instanceof port.ArrayType)) {
        const got = a?.constructor?.name ?? typeof a;
        throw new InputError(`input "${port.name}": a ${got}, wanted a ${port.ArrayType.name} (${port.dtype})`);
      }
      if (a.length !== port.size) {
        throw new InputError(
          `input "${port.name}": ${a.length} values, wanted ${port.size} (shape [${port.shape.join(", ")}])`,
        );
      }
      const bytes = new Uint8Array(buffer, at, port.bytes);
      bytes.set(new Uint8Array(a.buffer, a.byteOffset, port.bytes));
      swap(bytes, port.width);
      at += port.bytes;
    });
    return buffer;
  }

  /** An answer's typed arrays, one per output, from a message: binary
   * bytes, or the JSON text of a `format: "json"` stream. */
  decode(data) {
    if (typeof data === "string") return this.decodeJson(data);
    const bytes = toBytes(data);
    if (bytes.length !== this.answerBytes) {
      throw new ProtocolError(`an answer of ${bytes.length} bytes, wanted ${this.answerBytes}`);
    }
    let at = 0;
    return this.outputs.map((port) => {
      // A copy: aligned for the typed array, and the caller's own.
      const own = bytes.slice(at, at + port.bytes);
      swap(own, port.width);
      at += port.bytes;
      return new port.ArrayType(own.buffer);
    });
  }

  /** A JSON answer's arrays, each of its output's typed array: numbers, or
   * the strings "NaN", "Infinity", "-Infinity" (JSON has no number for
   * them). */
  decodeJson(text) {
    let answer;
    try {
      answer = JSON.parse(text);
    } catch (e) {
      throw new ProtocolError(`a JSON answer that is not JSON (${e.message}): ${text.slice(0, 200)}`);
    }
    const outputs = answer?.outputs;
    if (!Array.isArray(outputs) || outputs.length !== this.outputs.length) {
      throw new ProtocolError(`a JSON answer without ${this.outputs.length} outputs: ${text.slice(0, 200)}`);
    }
    return this.outputs.map((port, k) => {
      const values = outputs[k];
      if (!Array.isArray(values) || values.length !== port.size) {
        throw new ProtocolError(`output "${port.name}": ${values?.length ?? "no"} numbers, wanted ${port.size}`);
      }
      const out = new port.ArrayType(port.size);
      values.forEach((v, i) => {
        const x = number(port, v);
        if (port.ArrayType === BigInt64Array || port.ArrayType === BigUint64Array) out[i] = BigInt(x);
        else if (port.dtype === "f16") out[i] = halfBits(x);
        else if (port.dtype === "bool") out[i] = x ? 1 : 0;
        else out[i] = x;
      });
      return out;
    });
  }
}

const NON_FINITE = { NaN: NaN, Infinity: Infinity, "-Infinity": -Infinity };

function number(port, v) {
  if (typeof v === "number") return v;
  // `null` too: a server before the strings wrote non-finite values so.
  if (v === null) return NaN;
  if (typeof v === "string" && v in NON_FINITE) return NON_FINITE[v];
  throw new ProtocolError(`output "${port.name}": ${JSON.stringify(v)} is not a number`);
}

function toBytes(data) {
  if (data instanceof ArrayBuffer) return new Uint8Array(data);
  if (ArrayBuffer.isView(data)) return new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
  throw new ProtocolError(`a message of type ${data?.constructor?.name ?? typeof data} where an answer was due`);
}

// ---------------------------------------------------------------- stream

/** One stream of a served model, connected, its hello read. `model`,
 * `inputs`, `outputs` (ports), `resume` (the pulse the server expects
 * first: 0 for a fresh stream), `streamId`, `format`, `audio` (an `Audio`,
 * or null), `hello` (all of it). Calls may overlap: answers come in order. */
export class Stream {
  constructor(ws, hello, url) {
    this.ws = ws;
    this.hello = hello;
    this.url = url;
    this.waiting = [];
    this.error = null;
    /** Resolves, once the connection is over, to how it ended: a `Closed`
     * (or `ConnectionLost`) error, or null after `close()`. */
    this.ended = new Promise((resolve) => (this.onEnded = resolve));
  }

  get model() {
    return this.hello.model;
  }
  get inputs() {
    return this.hello.inputs;
  }
  get outputs() {
    return this.hello.outputs;
  }
  get resume() {
    return this.hello.resume;
  }
  get streamId() {
    return this.hello.streamId;
  }
  get format() {
    return this.hello.format;
  }
  get audio() {
    return this.hello.audio;
  }

  /** Sends one pulse, a typed array per fed input in the hello's order
   * (each its input's type and length: an `InputError` naming the input
   * otherwise), and resolves to the answer: a typed array per output. */
  call(...arrays) {
    try {
      return this.send(this.hello.encode(arrays));
    } catch (e) {
      return Promise.reject(e);
    }
  }

  /** Sends one pulse given as its bytes (every input, little-endian, an
   * ArrayBuffer or a view) and resolves to the answer's typed arrays. */
  send(pulse) {
    if (this.error) return Promise.reject(this.error);
    const bytes = toBytes(pulse);
    if (bytes.length !== this.hello.pulseBytes) {
      return Promise.reject(new InputError(`a pulse is ${this.hello.pulseBytes} bytes, got ${bytes.length}`));
    }
    return new Promise((resolve, reject) => {
      this.waiting.push({ resolve, reject });
      this.ws.send(bytes);
    });
  }

  /** Closes the stream (1000). Answers still due are lost: await every
   * call first. Resolves once the connection is closed. */
  async close() {
    if (!this.error) this.fail(new InputError("the stream is closed"));
    if (this.ws.readyState === 0 || this.ws.readyState === 1) this.ws.close(1000);
    await this.ended;
  }

  // The events of the socket, from `connect`.
  message(data) {
    const call = this.waiting.shift();
    if (!call) {
      this.abort(new ProtocolError("an answer to no pulse"));
      return;
    }
    try {
      call.resolve(this.hello.decode(data));
    } catch (e) {
      call.reject(e);
      this.abort(e);
    }
  }

  closed(code, reason) {
    const mine = this.error instanceof InputError;
    this.fail(Closed.of(code, reason));
    this.onEnded(mine ? null : this.error);
  }

  fail(error) {
    if (!this.error) this.error = error;
    for (const call of this.waiting.splice(0)) call.reject(this.error);
  }

  abort(error) {
    this.fail(error);
    this.ws.close(1000);
  }
}

/** Connects to `url` (`ws://HOST:PORT/v1/models/NAME/stream`) and
 * resolves to the `Stream` once the hello is read.
 *
 * Options: `stream`, the stream id (sent as `?stream=`: a browser cannot
 * set headers; read where the server has a store); `format`, "binary" (the
 * default) or "json" answers; `WebSocket`, the constructor to use (default
 * `globalThis.WebSocket`; in Node 20, the `ws` package's); `timeoutMs`,
 * how long the upgrade and the hello may take (default 10 s).
 *
 * Rejects with `ConnectFailed`, `UpgradeFailed` (`UnknownModel`,
 * `Unavailable`), a `Closed` before the hello, or `ProtocolError`. */
export function connect(url, options = {}) {
  const { stream = null, format = "binary", timeoutMs = 10000 } = options;
  const WebSocketClass = options.WebSocket ?? globalThis.WebSocket;
  if (typeof WebSocketClass !== "function") {
    return Promise.reject(
      new InputError("no WebSocket here: pass one as the WebSocket option (in Node 20: the ws package's)"),
    );
  }
  if (format !== "binary" && format !== "json") {
    return Promise.reject(new InputError(`format "${format}": binary or json`));
  }
  const target = new URL(url);
  if (stream !== null) target.searchParams.set("stream", stream);
  if (format === "json") target.searchParams.set("format", "json");
  return new Promise((resolve, reject) => {
    let ws;
    try {
      ws = new WebSocketClass(target.href);
    } catch (e) {
      reject(new InputError(`${url}: ${e.message}`));
      return;
    }
    ws.binaryType = "arraybuffer";
    let opened = false;
    let session = null;
    let why = "";
    let refusal = null;
    const settle = (error) => {
      clearTimeout(timer);
      if (error) reject(error);
    };
    const timer = setTimeout(() => {
      settle(new ConnectFailed(url, `no hello within ${timeoutMs} ms`));
      try {
        ws.close();
      } catch {
        // Not yet open: ws throws; a browser closes it anyway.
      }
    }, timeoutMs);
    // Node's `ws` tells the HTTP answer of a refused upgrade; read it.
    if (typeof ws.on === "function") {
      ws.on("unexpected-response", (request, response) => {
        let body = "";
        response.setEncoding("utf8");
        response.on("data", (d) => {
          if (body.length < 4096) body += d;
        });
        response.on("end", () => {
          refusal = UpgradeFailed.of(url, response.statusCode, body.trim());
          settle(refusal);
          request.destroy();
        });
      });
    }
    ws.onopen = () => {
      opened = true;
    };
    ws.onerror = (e) => {
      why = e?.message ?? e?.error?.message ?? "";
    };
    ws.onmessage = (e) => {
      if (session) {
        session.message(e.data);
        return;
      }
      try {
        session = new Stream(ws, new Hello(e.data), url);
      } catch (error) {
        settle(error);
        ws.close(1000);
        return;
      }
      settle(null);
      resolve(session);
    };
    ws.onclose = (e) => {
      if (session) {
        session.closed(e.code, e.reason || why);
      } else if (refusal) {
        // Said already.
      } else if (opened) {
        settle(Closed.of(e.code, e.reason || why));
      } else if (typeof ws.on === "function") {
        // Node: no HTTP answer at all.
        settle(new ConnectFailed(url, why || `closed ${e.code}`));
      } else {
        // A browser says nothing of why an upgrade failed.
        settle(new UpgradeFailed(url));
      }
    };
  });
}

// ---------------------------------------------------------------- resume

/** An id nobody can guess (whoever knows a stream's id may take its
 * record over): 128 random bits, hex. */
export function newStreamId() {
  const bytes = new Uint8Array(16);
  globalThis.crypto.getRandomValues(bytes);
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

/** Sends every pulse of `pulses` on one stream and resolves to every
 * answer (each a list of typed arrays, one per output), in order; as
 * `laned client` does, a close 1012 (the server restarts, the stream
 * handed over) or a dropped connection is followed: reconnected with the
 * same id, the pulses resent from the new hello's `resume`, for
 * `resumeForMs` from each interruption (the window starts over at each
 * interruption the stream gets past). A URL that never gave a connection
 * is not retried.
 *
 * `pulses`: an array of pulses, each a typed array (a model of one input)
 * or an array of typed arrays (one per input); or a function of the first
 * `Stream` returning one (`(s) => s.audio.cut(samples)`).
 *
 * Options: `connect`'s (`stream` defaults to `newStreamId()`), and
 * `resumeForMs` (default 30000; 0: never), `everyMs` (a pulse every this
 * many ms; 0, the default: each once the last is answered), `onEvent(line)`
 * (each reconnection), `onAnswer(k, outputs)` (each answer, k its pulse).
 * An error thrown carries `answers` (those had) and `streamId`. */
export async function streamAll(url, pulses, options = {}) {
  const id = options.stream ?? newStreamId();
  const window = options.resumeForMs ?? 30000;
  const everyMs = options.everyMs ?? 0;
  const answers = [];
  let list = null;
  let connected = false;
  let interrupted = null;
  for (;;) {
    const before = answers.length;
    let s = null;
    try {
      s = await connect(url, { ...options, stream: id });
      connected = true;
      if (list === null) list = typeof pulses === "function" ? pulses(s) : pulses;
      if (s.resume > answers.length) {
        throw new ProtocolError(`the server resumes at pulse ${s.resume}, ${answers.length} answered here`);
      }
      answers.length = s.resume;
      const start = Date.now();
      for (let k = s.resume; k < list.length; k++) {
        if (everyMs > 0) {
          const wait = start + (k - s.resume) * everyMs - Date.now();
          if (wait > 0) await new Promise((r) => setTimeout(r, wait));
        }
        const p = list[k];
        const out = await (Array.isArray(p) ? s.call(...p) : s.call(p));
        answers.push(out);
        options.onAnswer?.(k, out);
      }
      await s.close();
      return answers;
    } catch (error) {
      if (s) await s.close().catch(() => {});
      if (answers.length > before) interrupted = null;
      const resumable =
        error instanceof Closed
          ? error.resumable
          : error instanceof ConnectFailed || (error instanceof UpgradeFailed && error.status === null)
            ? connected
            : false;
      const now = Date.now();
      interrupted ??= now;
      if (!resumable || window <= 0 || now - interrupted > window) {
        error.answers = answers;
        error.streamId = id;
        throw error;
      }
      options.onEvent?.(`stream ${id}: ${error.message}: reconnecting`);
      await new Promise((r) => setTimeout(r, 100));
    }
  }
}
