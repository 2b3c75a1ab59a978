"""Audio for models whose hello says how to cut it (`"audio"`), and the
WAV files the command reads.

A model fed audio names its `sample_rate`, its `hop` (new samples a
pulse) and its `context` (samples of the previous pulse repeated at the
head of each): pulse k holds samples[k*hop - context : k*hop + hop],
zeros before the first sample and after the last. Silero VAD: 16000 Hz,
hop 512, context 64, so a pulse is 576 samples.
"""

from dataclasses import dataclass
import wave

import numpy as np

from .errors import InputError, ProtocolError


@dataclass(frozen=True)
class Audio:
    """How a model's pulses are cut from a stream of samples."""

    sample_rate: int
    hop: int
    context: int

    @property
    def pulse_len(self):
        """Samples in one pulse: `context` then `hop`."""
        return self.context + self.hop

    def cut(self, samples, shape=None):
        """`samples` (1-D) cut into pulses: an array of one row a pulse,
        `pulse_len` samples each (see `cut_pulses`); with `shape`, each
        pulse reshaped to it (the input's shape, `stream.inputs[0].shape`)."""
        pulses = cut_pulses(samples, self.hop, self.context)
        if shape is not None:
            pulses = pulses.reshape((len(pulses),) + tuple(shape))
        return pulses

    @staticmethod
    def of(field):
        """The hello's `audio` field (`None` where the hello has none)."""
        if field is None:
            return None
        try:
            audio = Audio(int(field["sample_rate"]), int(field["hop"]), int(field.get("context", 0)))
        except (AttributeError, KeyError, TypeError, ValueError) as e:
            raise ProtocolError(f"the hello's audio {field!r} is not sample_rate, hop, context: {e}") from None
        if audio.sample_rate <= 0 or audio.hop <= 0 or audio.context < 0:
            raise ProtocolError(f"the hello's audio {field!r} is not positive")
        return audio


def cut_pulses(samples, hop, context=0, dtype=np.float32):
    """A 1-D array of samples cut into pulses of `context + hop` samples:
    pulse k is samples[k*hop - context : k*hop + hop], zeros before index
    0, the last pulse padded with zeros; ceil(len / hop) pulses in all.
    Returns a 2-D array, a row a pulse."""
    samples = np.asarray(samples)
    if samples.ndim != 1:
        raise InputError(f"samples of shape {samples.shape}: wanted one dimension (mono)")
    if hop <= 0 or context < 0:
        raise InputError(f"hop {hop}, context {context}: wanted hop > 0, context >= 0")
    count = -(-len(samples) // hop)
    padded = np.zeros(context + count * hop, dtype)
    padded[context : context + len(samples)] = samples
    if count == 0:
        return np.zeros((0, context + hop), dtype)
    # Row k starts at padded[k * hop]; rows overlap by `context` samples.
    rows = np.lib.stride_tricks.as_strided(
        padded,
        shape=(count, context + hop),
        strides=(hop * padded.strides[0], padded.strides[0]),
        writeable=False,
    )
    return rows.copy()


def read_wav(path):
    """A mono 16-bit PCM WAV's samples as `float32` in [-1, 1) (each
    sample / 32768) and its sample rate."""
    try:
        with wave.open(str(path), "rb") as w:
            channels, width, rate = w.getnchannels(), w.getsampwidth(), w.getframerate()
            frames = w.readframes(w.getnframes())
    except (wave.Error, EOFError) as e:
        raise InputError(f"{path}: not a WAV this client reads ({e}): wanted 16-bit PCM, mono") from None
    except OSError as e:
        raise InputError(f"{path}: {e.strerror or e}") from None
    if channels != 1:
        raise InputError(f"{path}: {channels} channels, wanted mono")
    if width != 2:
        raise InputError(f"{path}: {8 * width}-bit samples, wanted 16-bit PCM")
    samples = np.frombuffer(frames, "<i2").astype(np.float32) / np.float32(32768.0)
    return samples, rate
