// The microphone page of `laned serve --web`: the browser's microphone,
// brought to the chosen model's sample rate, cut as its hello's `audio`
// says, one pulse a frame; each answer's outputs shown as numbers, and a
// one-value output (Silero's speech probability) plotted live.
//
// The capture runs at the microphone's own rate (the AudioContext is made
// at the track's rate, so the browser does not resample); where that is
// the model's rate the samples go as they come, else this page resamples
// them (a windowed sinc). `window.lanedPage.run(options)` is what the
// buttons do, and what a test drives (laned/tests/laned/js.rs).

import { LanedError, PulseCutter, connect } from "./laned.js";

const $ = (id) => document.getElementById(id);

// Gathers the capture into pieces of about 20 ms, the channels averaged
// (a mono source's channels are equal: the average is that channel).
const WORKLET = `
registerProcessor("laned-tap", class extends AudioWorkletProcessor {
  constructor() { super(); this.piece = []; this.size = 0; }
  process(inputs) {
    const channels = inputs[0];
    if (channels && channels.length > 0) {
      const mono = new Float32Array(channels[0].length);
      for (const c of channels) for (let i = 0; i < mono.length; i++) mono[i] += c[i];
      if (channels.length > 1) for (let i = 0; i < mono.length; i++) mono[i] /= channels.length;
      this.piece.push(mono); this.size += mono.length;
      if (this.size >= sampleRate / 50) {
        const out = new Float32Array(this.size);
        let at = 0;
        for (const m of this.piece) { out.set(m, at); at += m.length; }
        this.port.postMessage(out, [out.buffer]);
        this.piece = []; this.size = 0;
      }
    }
    return true;
  }
});`;

/** From one sample rate to another, a piece at a time: each output sample
 * a Blackman-windowed sinc over the input around its instant, the cutoff
 * the lower Nyquist (zeros before the first input sample). */
export class Resampler {
  constructor(from, to, zeros = 16) {
    this.step = from / to;
    this.cutoff = Math.min(1, to / from);
    this.half = Math.ceil(zeros / this.cutoff);
    this.buffer = new Float32Array(0);
    this.first = 0; // the input index of buffer[0]
    this.t = 0; // the input instant of the next output sample
  }

  push(samples) {
    const joined = new Float32Array(this.buffer.length + samples.length);
    joined.set(this.buffer);
    joined.set(samples, this.buffer.length);
    this.buffer = joined;
    const end = this.first + joined.length;
    const out = [];
    while (this.t + this.half < end) {
      const centre = Math.floor(this.t);
      let sum = 0;
      for (let n = centre - this.half + 1; n <= centre + this.half; n++) {
        if (n < this.first) continue;
        const x = (this.t - n) * this.cutoff;
        const sinc = x === 0 ? 1 : Math.sin(Math.PI * x) / (Math.PI * x);
        const w = (this.t - n) / this.half;
        const window = 0.42 + 0.5 * Math.cos(Math.PI * w) + 0.08 * Math.cos(2 * Math.PI * w);
        sum += joined[n - this.first] * sinc * window;
      }
      out.push(sum * this.cutoff);
      this.t += this.step;
    }
    const keep = Math.max(this.first, Math.floor(this.t) - this.half);
    this.buffer = joined.subarray(keep - this.first).slice();
    this.first = keep;
    return Float32Array.from(out);
  }
}

const plot = { values: [], max: 400 };

function drawPlot() {
  const canvas = $("plot");
  const g = canvas.getContext("2d");
  const { width, height } = canvas;
  g.clearRect(0, 0, width, height);
  g.strokeStyle = "#ddd";
  g.beginPath();
  g.moveTo(0, height / 2);
  g.lineTo(width, height / 2);
  g.stroke();
  const v = plot.values;
  if (v.length === 0) return;
  g.strokeStyle = "#1565c0";
  g.lineWidth = 2;
  g.beginPath();
  v.forEach((p, k) => {
    const x = (k / (plot.max - 1)) * width;
    const y = height - Math.min(1, Math.max(0, p)) * (height - 4) - 2;
    if (k === 0) g.moveTo(x, y);
    else g.lineTo(x, y);
  });
  g.stroke();
}

function say(text, error = false) {
  $("status").textContent = text;
  $("status").className = error ? "error" : "";
}

const shown = (a) =>
  Array.from(a.subarray(0, 12), (x) => (typeof x === "bigint" ? x.toString() : Number(x).toPrecision(4))).join(" ") +
  (a.length > 12 ? ` ... (${a.length} values)` : "");

function showOutputs(stream, outputs) {
  const table = $("outputs");
  if (table.rows.length !== outputs.length) {
    table.innerHTML = "";
    stream.outputs.forEach((p) => {
      const row = table.insertRow();
      row.insertCell().textContent = `${p.name} ${p.dtype} [${p.shape.join(", ")}]`;
      row.insertCell().className = "values";
    });
  }
  outputs.forEach((a, k) => {
    table.rows[k].cells[1].textContent = shown(a);
  });
}

let running = null;

/** Streams the microphone to `model` until `stop()` (or, with `samples`,
 * until that many samples at the model's rate are sent, the last pulse
 * padded). Resolves to what was seen: `answers` (each an array per output
 * of numbers), `deviceRate`, `modelRate`, `resampled`, and with `keep`
 * the samples sent (`sent`). With `fromFirstSound`, the stream starts at
 * the first sample that is not zero (a test's WAV starts with silence). */
async function run({ model, samples = Infinity, keep = false, fromFirstSound = false } = {}) {
  if (running) throw new Error("already streaming");
  const listed = await (await fetch("/v1/models")).json();
  const entry = listed.models.find((m) => m.name === model);
  if (!entry) throw new Error(`no model ${model} here`);
  const url = `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}${entry.stream}`;
  const stream = await connect(url);
  const audio = stream.audio;
  if (!audio || stream.inputs.length !== 1 || stream.inputs[0].dtype !== "f32") {
    await stream.close();
    throw new Error(
      `model ${model} is not fed audio: its spec has no [model.audio] (it takes ${stream.inputs
        .map((p) => `${p.name} ${p.dtype} [${p.shape}]`)
        .join(", ")})`,
    );
  }
  let media, context, source, tap;
  try {
    // The samples as the microphone gives them: no processing.
    media = await navigator.mediaDevices.getUserMedia({
      audio: { echoCancellation: false, noiseSuppression: false, autoGainControl: false },
    });
    const trackRate = media.getAudioTracks()[0].getSettings().sampleRate;
    context = trackRate ? new AudioContext({ sampleRate: trackRate }) : new AudioContext();
    await context.audioWorklet.addModule(URL.createObjectURL(new Blob([WORKLET], { type: "text/javascript" })));
    source = context.createMediaStreamSource(media);
    tap = new AudioWorkletNode(context, "laned-tap");
    source.connect(tap);
  } catch (e) {
    media?.getTracks().forEach((t) => t.stop());
    await context?.close();
    await stream.close();
    throw e;
  }
  const deviceRate = context.sampleRate;
  const resampler = deviceRate === audio.sampleRate ? null : new Resampler(deviceRate, audio.sampleRate);

  const cutter = new PulseCutter(audio);
  const single = stream.outputs.length === 1 && stream.outputs[0].size === 1;
  $("plot-box").hidden = !single;
  $("plot-label").textContent = single ? `${stream.outputs[0].name}, the last ${plot.max} pulses (0 to 1)` : "";
  plot.values = [];
  drawPlot();
  $("facts").textContent =
    `${model}: ${audio.sampleRate} Hz, hop ${audio.hop}, context ${audio.context}; ` +
    `the microphone at ${deviceRate} Hz` +
    (resampler ? `, resampled here to ${audio.sampleRate} Hz` : ", sent as it comes");

  const seen = { answers: [], deviceRate, modelRate: audio.sampleRate, resampled: !!resampler, sent: keep ? [] : null };
  let taken = 0;
  let started = !fromFirstSound;
  let calls = Promise.resolve();
  let failed = null;
  let finish;
  const done = new Promise((resolve) => (finish = resolve));

  const send = (pulses) => {
    for (const pulse of pulses) {
      const sentAt = performance.now();
      const answer = stream.call(pulse);
      calls = calls.then(async () => {
        try {
          const outputs = await answer;
          seen.answers.push(outputs.map((a) => Array.from(a, Number)));
          if (single) {
            plot.values.push(Number(outputs[0][0]));
            if (plot.values.length > plot.max) plot.values.shift();
            drawPlot();
          }
          showOutputs(stream, outputs);
          say(`streaming: ${seen.answers.length} pulses answered, the last in ${(performance.now() - sentAt).toFixed(1)} ms`);
        } catch (e) {
          failed ??= e;
          finish();
        }
      });
    }
  };

  const stop = () => finish();
  running = { stop };
  tap.port.onmessage = ({ data }) => {
    if (failed || taken >= samples) return;
    let piece = data;
    if (!started) {
      const at = piece.findIndex((x) => x !== 0);
      if (at < 0) return;
      started = true;
      piece = piece.subarray(at);
    }
    if (resampler) piece = resampler.push(piece);
    piece = piece.subarray(0, Math.max(0, Math.min(piece.length, samples - taken)));
    taken += piece.length;
    if (keep) for (const x of piece) seen.sent.push(x);
    send(cutter.push(piece));
    if (taken >= samples) finish();
  };
  stream.ended.then((e) => {
    if (e) {
      failed ??= e;
      finish();
    }
  });
  say("streaming: waiting for the microphone");
  await done;
  tap.port.onmessage = null;
  source.disconnect();
  media.getTracks().forEach((t) => t.stop());
  await context.close();
  if (!failed) send(cutter.flush());
  await calls;
  await stream.close();
  running = null;
  if (failed) throw failed;
  say(`stopped: ${seen.answers.length} pulses answered`);
  return seen;
}

window.lanedPage = { run, stop: () => running?.stop(), Resampler };

async function main() {
  const select = $("model");
  try {
    const { models } = await (await fetch("/v1/models")).json();
    select.innerHTML = "";
    for (const m of models) {
      const option = document.createElement("option");
      option.value = option.textContent = m.name;
      select.append(option);
    }
    $("start").disabled = models.length === 0;
  } catch (e) {
    say(`/v1/models: ${e.message}`, true);
    return;
  }
  $("start").onclick = async () => {
    $("start").disabled = true;
    $("stop").disabled = false;
    try {
      await run({ model: select.value });
    } catch (e) {
      say(`${e instanceof LanedError ? `${e.name}: ` : ""}${e.message}`, true);
    } finally {
      $("start").disabled = false;
      $("stop").disabled = true;
    }
  };
  $("stop").onclick = () => running?.stop();
}

main();
