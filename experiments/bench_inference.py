"""The systems' inference against their PyTorch originals: Whisper's transcription, T5's
generation, DiT's sampling, CLIP's and SigLIP's embeddings, side by side in one sitting.

  python experiments/bench_inference.py --quick    # every row at tiny shapes, a minute or two
  python experiments/bench_inference.py            # the full table (see its README for the time)
  python experiments/bench_inference.py --systems whisper --whisper_sizes tiny --batches 1

Rows (random weights, float32, the CPU; torch on --torch_threads threads, CTranslate2 too):
- whisper: 30 s windows of whisper-tiny and -base shapes, --new_tokens tokens per window
  (end-of-text suppressed on every side, so that each writes the same number), greedy and beam
  5, batches 1 and 8: ours (decode.generate / decode.beam_search, the library functions
  --mode=sample calls) against transformers' generate, openai-whisper's decode and
  faster-whisper's engine (CTranslate2's Whisper, converted offline from the same checkpoint,
  float32 and int8), and ours with int8 weights and activations (quantization.int8_params, what
  --config.sample.int8 runs) beside them. Seconds per window and the real-time factor (seconds
  of compute per second of audio). Every side reads the same log-Mel features: the front end is
  not timed.
- t5: T5 1.1 small, inputs of 128 tokens, --t5_new_tokens new tokens (EOS suppressed), greedy
  and beam 4, batches 1 and 32, against transformers' generate; ours int8 beside transformers'
  model with PyTorch's dynamic int8 quantization of its linear layers (quantize_dynamic, the
  same scheme: int8 weights, activations quantized as they come).
- dit: DiT-S/2 (learned sigma) on 32x32x4 latents, a batch of --dit_batch images, DDIM-50 and
  DDPM-250 (--dit_steps), guidance 1 and 4: ours (models.dit.generate, jitted) against diffusers'
  DiTPipeline's loop over the same transformer (DiTTransformer2DModel) and scheduler
  (DDIMScheduler, DDPMScheduler with DiT's linear schedule and ADM's spacing), up to the
  latents (no VAE). Images per second.
- clip, siglip: CLIP ViT-B/32 and SigLIP B/16: image embeddings per second (a batch of 32),
  text embeddings per second (256 captions), and zero-shot classification of 32 images against
  100 class captions (the logits of every pair), against transformers' get_image_features,
  get_text_features and forward; ours a block of rows at a time (layers.row_blocks), as the
  package evaluates.
Before a row is timed, every side runs once and the outputs are checked: the same number of
tokens on every side, and where both compute the same deterministic thing (greedy decoding,
DDIM, the embeddings) how far they agree with ours (tokens identical, latents and embeddings
close). Each side is then timed --repeats times, interleaved; the median is reported with the
1-minute load average. Without a peer library its column is skipped with a line saying so.
open_clip is not a peer here: it needs torchvision, whose PyPI wheel does not load beside the
CPU torch 2.13.0 (experiments/results/bench_systems/README.md).
Measured figures: experiments/results/bench_systems/README.md.
"""
import dataclasses
import functools
import importlib.util
import json
import os
import pathlib
import statistics
import tempfile
import time
import warnings
from typing import Callable

from absl import app, flags
import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax import convert, decode, diffusion, layers, models, quantization
from transformer_jax.models import dit
from transformer_jax.train import cpu_runtime, metrics

SYSTEMS = ('whisper', 't5', 'dit', 'clip', 'siglip')

_SYSTEMS = flags.DEFINE_list('systems', list(SYSTEMS), f'Of {SYSTEMS}.')
_WHISPER_SIZES = flags.DEFINE_list('whisper_sizes', ['tiny', 'base'], 'Whisper shapes.')
_BATCHES = flags.DEFINE_list('batches', ['1', '8'], "Whisper's batches (windows per call).")
_T5_BATCHES = flags.DEFINE_list('t5_batches', ['1', '32'], "T5's batches.")
_NEW_TOKENS = flags.DEFINE_integer('new_tokens', 100, 'Tokens per Whisper window.')
_T5_NEW_TOKENS = flags.DEFINE_integer('t5_new_tokens', 64, 'New tokens per T5 input.')
_DIT_BATCH = flags.DEFINE_integer('dit_batch', 2, 'Images per DiT call.')
_DIT_STEPS = flags.DEFINE_list('dit_steps', ['ddim50', 'ddpm250'], 'DiT samplers and steps.')
_REPEATS = flags.DEFINE_integer('repeats', 2, 'Timed calls per side, interleaved.')
_TORCH_THREADS = flags.DEFINE_integer('torch_threads', 2, "torch's and CTranslate2's threads.")
_JSON_OUT = flags.DEFINE_string('json_out', None, 'Also write the rows here as JSON.')
_QUICK = flags.DEFINE_bool('quick', False, 'Every row at tiny shapes, one timed call per side: '
                           'a check that it runs and that the sides agree.')


def load_average() -> str:
  return f'load {os.getloadavg()[0]:.2f}'


def missing(*modules: str) -> list[str]:
  return [name for name in modules if importlib.util.find_spec(name) is None]


@dataclasses.dataclass
class Row:
  """One row: `sides` {name: call() -> a numpy result}, each call making `units` of `unit`
  (windows, sequences, images, embeddings); `check` (results -> a note) raises where the sides
  disagree; `seconds_of_audio` per unit, for the real-time factor."""
  system: str
  name: str
  unit: str
  units: int
  sides: dict[str, Callable[[], np.ndarray]]
  check: Callable[[dict[str, np.ndarray]], str]
  seconds_of_audio: float | None = None


def measure(row: Row, repeats: int) -> dict:
  """Each side once (compiling ours) and the check, then `repeats` interleaved timed calls."""
  print(f'{row.system}: {row.name}', flush=True)
  results = {side: np.asarray(call()) for side, call in row.sides.items()}
  check = row.check(results)
  print(f'  check: {check}', flush=True)
  seconds = {side: [] for side in row.sides}
  for _ in range(repeats):
    for side, call in row.sides.items():
      start = time.perf_counter()
      call()
      seconds[side].append(time.perf_counter() - start)
  out = dict(system=row.system, row=row.name, unit=row.unit, units=row.units, check=check,
             sides={})
  ours = statistics.median(seconds['ours'])
  ours_int8 = statistics.median(seconds['ours int8']) if 'ours int8' in seconds else None
  for side, times in seconds.items():
    median = statistics.median(times)
    per_unit = median / row.units
    entry = dict(seconds=median, all_seconds=times, per_unit_s=per_unit,
                 units_per_s=row.units / median, ours_speedup=median / ours,
                 load=os.getloadavg()[0])
    if ours_int8:
      entry['ours_int8_speedup'] = median / ours_int8
    rate = f'{per_unit:8.4f} s per {row.unit}, {row.units / median:9.2f} {row.unit}s/s'
    if row.seconds_of_audio:
      entry['real_time_factor'] = per_unit / row.seconds_of_audio
      rate += f', RTF {entry["real_time_factor"]:.4f}'
    int8 = f'  ours int8 {entry["ours_int8_speedup"]:5.2f}x' if ours_int8 else ''
    print(f'    {side:<22} {median:8.3f} s  {rate}  ours {entry["ours_speedup"]:5.2f}x{int8}  '
          f'({load_average()})', flush=True)
    out['sides'][side] = entry
  return out


def first_difference(a: np.ndarray, b: np.ndarray) -> str:
  """Where two token arrays (B, N) first differ, or that they are equal."""
  if a.shape != b.shape:
    return f'shapes {a.shape} and {b.shape}'
  differ = np.argwhere(a != b)
  return 'identical' if not len(differ) else f'first differ at row {differ[0][0]}, token ' \
                                               f'{differ[0][1]}'


def token_check(new_tokens: int, greedy: bool):
  """Every side wrote new_tokens per row (raises otherwise); how each side's tokens (greedy, or
  the best beam's) compare with ours, for the record: float32 rounding can turn a near-tie
  (int8 more), and the beam searches differ in their details."""
  def check(results: dict[str, np.ndarray]) -> str:
    notes = []
    for side, tokens in results.items():
      if tokens.shape[-1] != new_tokens:
        raise RuntimeError(f'{side} wrote {tokens.shape[-1]} tokens per row, not {new_tokens}: '
                           'the sides would not do the same work.')
      if side != 'ours':
        notes.append(f'{side} {first_difference(tokens, results["ours"])}')
    what = 'greedy tokens' if greedy else "the best beam's tokens"
    return f'{new_tokens} tokens per row on every side; {what} against ours: ' + ', '.join(notes)
  return check


def close_check(what: str, rtol: float):
  """Each side's output within rtol of ours (the largest difference over ours' largest
  magnitude)."""
  def check(results: dict[str, np.ndarray]) -> str:
    ours, notes = results['ours'], []
    for side, value in results.items():
      if side == 'ours':
        continue
      relative = float(np.abs(value - ours).max() / np.abs(ours).max())
      if not relative <= rtol:
        raise RuntimeError(f'{side}\'s {what} differ from ours by {relative:.1e} (relative), '
                           f'more than {rtol:g}: the sides do not compute the same thing.')
      notes.append(f'{side} {relative:.1e}')
    return f'{what} relative to ours: ' + ', '.join(notes)
  return check


def ours_model(directory: str):
  """(module, params) of the checkpoint in `directory`, float32, as a run builds it."""
  fields, params = convert.load(directory)
  cfg = models.model_config({**fields, 'dtype': 'float32'})
  return models.build(cfg), jax.device_put(params)


# Whisper.

def whisper_rows(directory: str, size: str, batches: list[int], new_tokens: int) -> list[Row]:
  """Whisper of `size`: its checkpoint (and the CTranslate2 conversions) in `directory`."""
  import torch
  import system_peers as peers
  hf = peers.whisper_checkpoint(size, f'{directory}/hf')
  model, params = ours_model(f'{directory}/hf')
  int8_params = jax.device_put(quantization.int8_params(model.cfg, params))
  config = hf.config
  frames, window = 2 * config.max_source_positions, 2 * config.max_source_positions / 100
  features = np.random.default_rng(0).uniform(
      -1, 1, (max(batches), frames, config.num_mel_bins)).astype(np.float32)
  openai = peers.openai_whisper(hf) if not missing('whisper') else None
  engines = {}
  if not missing('ctranslate2', 'whisper'):
    for compute_type in ('float32', 'int8'):
      engines[compute_type] = peers.ctranslate2_whisper(
          f'{directory}/hf', f'{directory}/ct2_{compute_type}', compute_type)
  rows = []
  for beams in (1, 5):
    for batch in batches:
      rows.append(Row('whisper', f'whisper-{size}, {"greedy" if beams == 1 else "beam 5"}, '
                      f'batch {batch}', 'window', batch,
                      whisper_sides(model, params, int8_params, hf, openai, engines,
                                    features[:batch], beams, new_tokens, torch),
                      token_check(new_tokens, beams == 1), seconds_of_audio=window))
  return rows


def whisper_sides(model, params, int8_params, hf, openai, engines, features, beams: int,
                  new_tokens: int, torch) -> dict:
  import system_peers as peers
  batch = features.shape[0]
  prompt = np.array([peers.WHISPER_PROMPT] * batch, np.int32)
  inputs = jnp.asarray(features)
  if beams == 1:
    ours = lambda params: decode.generate(model, params, prompt, inputs=inputs,
                                          max_new_tokens=new_tokens).tokens
  else:
    ours = lambda params: decode.beam_search(model, params, prompt, inputs=inputs,
                                             beam_size=beams,
                                             max_new_tokens=new_tokens).tokens[:, 0]
  sides = {'ours': lambda: jax.device_get(ours(params)),
           'ours int8': lambda: jax.device_get(ours(int8_params))}
  mel = torch.from_numpy(features.transpose(0, 2, 1).copy())

  @torch.inference_mode()
  def transformers_generate():
    return hf.generate(input_features=mel, decoder_input_ids=torch.from_numpy(prompt).long(),
                       max_new_tokens=new_tokens, min_new_tokens=new_tokens, num_beams=beams,
                       do_sample=False).numpy()[:, -new_tokens:]
  sides['transformers'] = transformers_generate
  if openai is not None:
    import whisper
    options = whisper.DecodingOptions(
        language='en', task='transcribe', without_timestamps=True,
        beam_size=None if beams == 1 else beams, sample_len=new_tokens,
        suppress_tokens=[peers.WHISPER_EOT], suppress_blank=False, fp16=False)

    @torch.inference_mode()
    def openai_decode():
      # Its beam search fails on a batch of windows (the audio features are not repeated over
      # the beams; openai/whisper#2197, unmerged): the windows go one at a time, as its
      # transcribe runs them.
      chunks = [mel] if beams == 1 else [mel[i:i + 1] for i in range(batch)]
      return np.array([result.tokens for chunk in chunks
                       for result in whisper.decode(openai, chunk, options)])
    sides['openai-whisper'] = openai_decode
  for compute_type, engine in engines.items():
    def faster_whisper(engine=engine):
      import ctranslate2
      encoded = engine.encode(ctranslate2.StorageView.from_array(features.transpose(0, 2, 1)
                                                                 .copy()), to_cpu=False)
      # Its decoding runs to half of max_length (measured here), hence twice the tokens.
      results = engine.generate(encoded, prompt.tolist(), beam_size=beams,
                                max_length=2 * new_tokens, suppress_tokens=[peers.WHISPER_EOT],
                                suppress_blank=False)
      return np.array([result.sequences_ids[0] for result in results])
    sides[f'faster-whisper {compute_type}'] = faster_whisper
  return sides


# T5.

def t5_rows(directory: str, shape: str, batches: list[int], source_len: int,
            new_tokens: int) -> list[Row]:
  import torch
  import system_peers as peers
  hf = peers.T5(shape).build(directory).eval()
  with warnings.catch_warnings():  # PyTorch deprecates torch.ao.quantization for torchao
    warnings.simplefilter('ignore')
    hf_int8 = torch.ao.quantization.quantize_dynamic(hf, {torch.nn.Linear}, dtype=torch.qint8)
  model, params = ours_model(directory)
  int8_params = jax.device_put(quantization.int8_params(model.cfg, params))
  vocab = hf.config.vocab_size
  rows = []
  for beams in (1, 4):
    for batch in batches:
      ids = np.random.default_rng(batch).integers(2, vocab, (batch, source_len)).astype(np.int32)
      ids[:, -1] = 1
      start = np.zeros((batch, 1), np.int32)
      if beams == 1:
        ours = functools.partial(decode.generate, model, prompt_tokens=start, inputs=ids,
                                 max_new_tokens=new_tokens)
      else:
        ours = functools.partial(decode.beam_search, model, prompt_tokens=start, inputs=ids,
                                 beam_size=beams, max_new_tokens=new_tokens)

      @torch.inference_mode()
      def transformers_generate(peer, ids=ids, beams=beams):
        return peer.generate(input_ids=torch.from_numpy(ids).long(), max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, num_beams=beams,
                             do_sample=False).numpy()[:, 1:]
      best = (lambda out: out.tokens) if beams == 1 else (lambda out: out.tokens[:, 0])
      sides = {'ours': lambda ours=ours, best=best: jax.device_get(best(ours(params=params))),
               'ours int8': lambda ours=ours, best=best: jax.device_get(
                   best(ours(params=int8_params))),
               'transformers': functools.partial(transformers_generate, hf),
               'transformers int8': functools.partial(transformers_generate, hf_int8)}
      rows.append(Row('t5', f'T5 1.1 {shape}, {"greedy" if beams == 1 else "beam 4"}, batch '
                      f'{batch}', 'sequence', batch, sides, token_check(new_tokens, beams == 1)))
  return rows


# DiT.

def dit_rows(shape: str, batch: int, sampling: list[tuple[str, int]]) -> list[Row]:
  import diffusers
  import torch
  import system_peers as peers
  peer = peers.DiT(shape)
  torch.manual_seed(0)
  transformer = peer.make_model(learn_sigma=True).eval()
  cfg = models.model_config(peer.model_fields(learn_sigma=True))
  model, params = models.build(cfg), jax.device_put(peers.dit_params(transformer, cfg))
  labels = np.arange(batch, dtype=np.int32) % cfg.num_classes
  rng = jax.random.key(0)
  # dit.generate's first draw: its starting noise, which the pipeline is given.
  noise = np.asarray(jax.random.normal(jax.random.split(rng)[0], (
      batch, cfg.image_size, cfg.image_size, cfg.num_channels)))
  latents = torch.from_numpy(noise.transpose(0, 3, 1, 2).copy())
  # The schedulers as DiT's checkpoint configures them (DiT's linear schedule, latents not
  # clipped), at their default spacing: 'leading', steps at a stride of 1000 / N from 0.
  schedule = dict(num_train_timesteps=1000, beta_start=1e-4, beta_end=0.02,
                  beta_schedule='linear', clip_sample=False)
  rows = []
  for sampler, steps in sampling:
    for guidance in (1.0, 4.0):
      wanted = dit.SampleSettings(num_samples=batch, steps=steps, sampler=sampler,
                                  guidance_scale=guidance, clip_denoised=False)
      ours = jax.jit(functools.partial(dit.generate, model, settings=wanted))
      scheduler = (diffusers.DDIMScheduler(**schedule, set_alpha_to_one=True) if sampler == 'ddim'
                   else diffusers.DDPMScheduler(**schedule))

      @torch.inference_mode()
      def pipeline(scheduler=scheduler, steps=steps, guidance=guidance):
        out = peers.dit_pipeline_latents(transformer, scheduler, latents, labels, guidance,
                                         steps, cfg.num_classes)
        return out.numpy().transpose(0, 2, 3, 1)
      name = f'DiT-S/2 {shape}, {sampler.upper()}-{steps}, guidance {guidance:g}'
      rows.append(Row('dit', name, 'image', batch,
                      {'ours': lambda ours=ours: jax.device_get(ours(params, labels, rng)),
                       'diffusers': pipeline},
                      dit_check(model, params, cfg, sampler, steps, guidance, labels, noise)))
  return rows


def dit_check(model, params, cfg, sampler: str, steps: int, guidance: float, labels, noise):
  """DDPM draws its noise at every step, each side its own: only the shapes compare. DDIM is
  deterministic, but ours runs at DiT's spacing (ADM's space_timesteps, as DiT's sample.py)
  and diffusers' DDIMScheduler at its own ('leading': a stride of 1000 / N from 0; its
  'linspace' takes its previous step as t - 1000 / N all the same): the same steps of the same
  cost, at other timesteps. So the pipeline's latents are checked against our DDIM sampler
  (diffusion.ddim_sample, guided as dit.generate guides it) at the pipeline's timesteps (our
  'ddimN' spacing), from the same noise."""
  if sampler == 'ddpm':
    return lambda results: f'latents {", ".join(str(v.shape) for v in results.values())}'
  schedule = diffusion.respace(dit.schedule_of(cfg), f'ddim{steps}')
  model_fn = lambda x, t, y: model.apply({'params': params}, x, t, y)
  predict = (diffusion.guided_model_fn(model_fn, labels, cfg.num_classes, guidance)
             if guidance != 1 else lambda x, t: model_fn(x, t, labels))
  same_steps = np.asarray(jax.jit(lambda: diffusion.ddim_sample(schedule, predict, noise))())
  close = close_check('latents at the pipeline\'s timesteps', 1e-3)
  return lambda results: close({'ours': same_steps, 'diffusers': results['diffusers']})


# CLIP and SigLIP.

def dual_encoder_rows(directory: str, name: str, shape: str, images: int, texts: int,
                      classes: int) -> list[Row]:
  import torch
  import system_peers as peers
  peer = peers.PEERS[name](shape)
  hf = peer.build(directory).eval()
  model, params = ours_model(directory)
  image_batch = peer.batch(0, images)['image']
  text_batch, class_text = peer.batch(1, texts)['text'], peer.batch(2, classes)['text']
  # In blocks of rows, as the package's evaluation embeds (layers.row_blocks).
  def apply(method: str):
    def blocked(params, x, *more):
      with layers.row_blocks():
        return model.apply({'params': params}, x, *more, method=method)
    return jax.jit(blocked)
  embed_images, embed_texts, forward = (apply(m) for m in ('embed_images', 'embed_texts',
                                                           '__call__'))
  pixels = lambda x: torch.from_numpy(x.transpose(0, 3, 1, 2).copy())
  tokens = lambda t: torch.from_numpy(t).long()
  grad_free = lambda f: torch.inference_mode()(f)
  title = {'clip': 'CLIP ViT-B/32', 'siglip': 'SigLIP B/16'}[name] + f' {shape}'
  check = close_check('outputs', 1e-3)
  return [
      Row(name, f'{title}, image embeddings, batch {images}', 'image', images, {
          'ours': lambda: jax.device_get(embed_images(params, image_batch)),
          'transformers': grad_free(lambda: features(
              hf.get_image_features(pixel_values=pixels(image_batch))).numpy())}, check),
      Row(name, f'{title}, text embeddings, batch {texts}', 'caption', texts, {
          'ours': lambda: jax.device_get(embed_texts(params, text_batch)),
          'transformers': grad_free(lambda: features(hf.get_text_features(
              input_ids=tokens(text_batch), **peer.attention_mask(text_batch))).numpy())}, check),
      Row(name, f'{title}, zero-shot: {images} images x {classes} classes', 'image', images, {
          'ours': lambda: jax.device_get(forward(params, image_batch, class_text)),
          'transformers': grad_free(lambda: hf(
              pixel_values=pixels(image_batch), input_ids=tokens(class_text),
              **peer.attention_mask(class_text)).logits_per_image.numpy())}, check),
  ]


def features(output):
  """transformers 5's get_*_features return the pooled embeddings, or an output holding them."""
  return getattr(output, 'pooler_output', output)


def main(argv):
  del argv
  jax.config.update('jax_platforms', 'cpu')  # every side on the CPU, whatever else is here
  # Without the malloc settings launch.py applies: with the peers' allocations on the same heap
  # they slow our large programs (cpu_runtime.configure).
  cpu_runtime.configure(keep_freed_memory=False)
  quick = _QUICK.value
  absent = missing('torch', 'transformers')
  if absent:
    print(f'No peers: {", ".join(absent)} not installed (pip install -e \'.[bench]\'); nothing '
          'to compare against.')
    return
  import torch
  import transformers
  torch.set_num_threads(_TORCH_THREADS.value)
  transformers.logging.set_verbosity_error()
  for name, modules in (('openai-whisper', ('whisper',)), ('faster-whisper', ('ctranslate2',)),
                        ('DiT', ('diffusers',))):
    if missing(*modules):
      print(f'No {name} column: {", ".join(missing(*modules))} not installed (pip install -e '
            '\'.[bench]\').')
  unknown = set(_SYSTEMS.value) - set(SYSTEMS)
  if unknown:
    raise app.UsageError(f'--systems: {sorted(unknown)} unknown; of {SYSTEMS}.')
  print(f'jax {jax.__version__}, torch {torch.__version__}, {metrics.cpu_model()}, '
        f'{os.cpu_count()} CPUs, torch threads {torch.get_num_threads()}, {load_average()}')
  repeats = 1 if quick else _REPEATS.value
  rows = []
  with tempfile.TemporaryDirectory() as directory:
    for system in _SYSTEMS.value:
      folder = f'{directory}/{system}'
      if system == 'whisper':
        sizes = ['micro'] if quick else _WHISPER_SIZES.value
        batches = [1, 2] if quick else [int(b) for b in _BATCHES.value]
        for size in sizes:
          rows += [measure(row, repeats) for row in whisper_rows(
              f'{folder}_{size}', size, batches, 8 if quick else _NEW_TOKENS.value)]
      elif system == 't5':
        batches = [1, 2] if quick else [int(b) for b in _T5_BATCHES.value]
        rows += [measure(row, repeats) for row in t5_rows(
            folder, 'tiny' if quick else 'small', batches, 16 if quick else 128,
            8 if quick else _T5_NEW_TOKENS.value)]
      elif system == 'dit' and not missing('diffusers'):
        chosen = ['ddim5', 'ddpm10'] if quick else _DIT_STEPS.value
        sampling = [(name[:4], int(name[4:])) for name in chosen]
        rows += [measure(row, repeats) for row in dit_rows(
            'tiny' if quick else 'small', 2 if quick else _DIT_BATCH.value, sampling)]
      elif system in ('clip', 'siglip'):
        sizes = (4, 4, 3) if quick else (32, 256, 100)
        rows += [measure(row, repeats) for row in dual_encoder_rows(
            folder, system, 'tiny' if quick else 'small', *sizes)]
  print(f'{load_average()} at the end')
  if _JSON_OUT.value:
    pathlib.Path(_JSON_OUT.value).write_text(json.dumps(
        {'cpu': metrics.cpu_model(), 'cpus': os.cpu_count(), 'rows': rows}, indent=2))


if __name__ == '__main__':
  app.run(main)
