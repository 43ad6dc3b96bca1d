//! sentence-transformers all-MiniLM-L6-v2 run in-process.
//!
//! The model is a 6-layer BERT encoder (384 hidden, 12 heads). A sentence vector
//! is the mean of the last hidden states over the real (non-padding) tokens,
//! scaled to unit length — exactly what sentence-transformers' `Pooling` +
//! `Normalize` modules compute.
//!
//! Where the CPU runs one of `loomem_kernels`' dense kernels (int8 on
//! AVX-512 VNNI or on AVX2, bf16 on AVX-512 BF16) the encoder runs on them
//! ([`Native`]): a pass's texts end to end with no padding. Elsewhere (or
//! with `precision = "bf16"` where AVX-512 BF16 is missing) it runs on
//! candle in f32, each sub-batch padded to its longest text. The
//! safetensors file is read once either way; the candle layers are loaded
//! only where they run.
//!
//! Inference runs on dedicated threads, never on the async runtime: one for
//! the pipeline's batches, one for search queries (a query does not wait for a
//! batch pass to end). Calls that arrive while a thread is busy are merged
//! into its next pass, and each pass sorts its texts by token count and cuts
//! them into sub-batches (on candle each padded to its longest member, so
//! short texts do not pay for long ones). Either thread runs its
//! sub-batches on every CPU side by side, each with single-threaded kernels
//! (see [`kernel_threads`]); a lone query is one sub-batch, on one CPU.

use std::path::{Path, PathBuf};
use std::sync::mpsc as std_mpsc;

use candle_core::{DType, Device, Module, Storage, Tensor};
use candle_nn::{embedding, layer_norm, linear, Embedding, LayerNorm, Linear, VarBuilder};
use rayon::prelude::*;

use crate::core::vector;
use futures::future::BoxFuture;
use tokenizers::{Tokenizer, TruncationParams};
use tokio::sync::oneshot;

use loomem_kernels::{bf16, int8, nn, Dense as Packed};

use super::config::Precision;
use super::{EmbedError, Embedder};

/// The files a model directory must hold.
pub const MODEL_FILES: [&str; 3] = ["config.json", "model.safetensors", "tokenizer.json"];

/// Name recorded in `embed_model`.
pub const MODEL_NAME: &str = "all-MiniLM-L6-v2";

/// What `config.json` says about the encoder (the keys this code needs).
#[derive(Debug, serde::Deserialize)]
struct BertConfig {
    hidden_size: usize,
    num_attention_heads: usize,
    num_hidden_layers: usize,
    intermediate_size: usize,
    max_position_embeddings: usize,
    vocab_size: usize,
    type_vocab_size: usize,
    layer_norm_eps: f64,
    #[serde(default)]
    hidden_act: Option<String>,
}

struct Layer {
    query: Dense,
    key: Dense,
    value: Dense,
    attn_out: Dense,
    attn_norm: LayerNorm,
    intermediate: Dense,
    out: Dense,
    out_norm: LayerNorm,
}

/// Most rows (tokens of a pass) a dense layer multiplies itself; above it,
/// candle's blocked matrix multiply. A query is a handful of tokens, and
/// for it candle spent half its time copying each weight matrix into the
/// multiply's blocked layout (`perf`, the search bench at 100k memories):
/// [`vector::linear_t`] reads the weights where they lie.
const SMALL_ROWS: usize = 48;

/// A BERT dense layer, optionally followed by its GELU.
struct Dense {
    linear: Linear,
}

impl Dense {
    fn load(inputs: usize, outputs: usize, vb: VarBuilder) -> CandleResult<Dense> {
        let l = linear(inputs, outputs, vb)?;
        // Contiguous, so the short passes can read the rows in place.
        let bias = l.bias().map(|b| b.contiguous()).transpose()?;
        Ok(Dense {
            linear: Linear::new(l.weight().contiguous()?, bias),
        })
    }

    fn forward(&self, x: &Tensor) -> CandleResult<Tensor> {
        self.apply(x, false)
    }

    /// The layer, then GELU ([`nn::gelu_erf`]).
    fn forward_gelu(&self, x: &Tensor) -> CandleResult<Tensor> {
        self.apply(x, true)
    }

    fn apply(&self, x: &Tensor, gelu: bool) -> CandleResult<Tensor> {
        let inputs = x.dims().last().copied().unwrap_or(0);
        let rows = x.elem_count() / inputs.max(1);
        let Some(mut out) = self.small_pass(x, inputs, rows)? else {
            let y = self.linear.forward(x)?;
            if !gelu {
                return Ok(y);
            }
            let mut flat = values(&y)?;
            nn::gelu_erf(&mut flat);
            return Tensor::from_vec(flat, y.dims(), y.device());
        };
        if gelu {
            nn::gelu_erf(&mut out);
        }
        let mut dims = x.dims().to_vec();
        *dims.last_mut().expect("a dimension") = out.len() / rows;
        Tensor::from_vec(out, dims, x.device())
    }

    /// The layer's output for a pass of at most [`SMALL_ROWS`] rows, row-major,
    /// multiplied by [`vector::linear_t`]; None for larger passes (candle's).
    fn small_pass(&self, x: &Tensor, inputs: usize, rows: usize) -> CandleResult<Option<Vec<f32>>> {
        if rows > SMALL_ROWS || inputs == 0 {
            return Ok(None);
        }
        let (w, w_layout) = self.linear.weight().storage_and_layout();
        let bias = self.linear.bias().map(Tensor::storage_and_layout);
        let (Storage::Cpu(w), Some((Storage::Cpu(b), b_layout))) =
            (&*w, bias.as_ref().map(|(s, l)| (&**s, l)))
        else {
            return Ok(None);
        };
        let n = w_layout.dims()[0];
        let w = &w.as_slice::<f32>()?[w_layout.start_offset()..][..n * inputs];
        let b = &b.as_slice::<f32>()?[b_layout.start_offset()..][..n];
        let xs = values(x)?;
        // The weight rows split over the pass's kernel threads.
        let per = n.div_ceil(rayon::current_num_threads()).next_multiple_of(4);
        let mut out_t = vec![0.0f32; n * rows];
        out_t
            .par_chunks_mut(per * rows)
            .zip(w.par_chunks(per * inputs))
            .zip(b.par_chunks(per))
            .for_each(|((out, w), b)| vector::linear_t(&xs, inputs, w, b, out));
        let mut out = vec![0.0f32; rows * n];
        for (o, column) in out_t.chunks_exact(rows).enumerate() {
            for (r, v) in column.iter().enumerate() {
                out[r * n + o] = *v;
            }
        }
        Ok(Some(out))
    }
}

/// The BERT encoder, loaded from safetensors.
struct Encoder {
    words: Embedding,
    positions: Embedding,
    token_type0: Tensor,
    embed_norm: LayerNorm,
    layers: Vec<Layer>,
    heads: usize,
    head_dim: usize,
    hidden: usize,
    device: Device,
    native: Option<Native>,
}

type CandleResult<T> = candle_core::Result<T>;

/// A layer norm's scale and shift.
struct Norm {
    gamma: Vec<f32>,
    beta: Vec<f32>,
}

impl Norm {
    fn load(h: usize, vb: VarBuilder) -> CandleResult<Norm> {
        Ok(Norm {
            gamma: vb.get(h, "weight")?.to_vec1()?,
            beta: vb.get(h, "bias")?.to_vec1()?,
        })
    }
}

/// One encoder layer in the kernels' panels (int8 or bf16): the query, key
/// and value projections as one layer of 3 × hidden outputs.
struct NativeLayer {
    qkv: Box<dyn Packed>,
    attn_out: Box<dyn Packed>,
    attn_norm: Norm,
    intermediate: Box<dyn Packed>,
    out: Box<dyn Packed>,
    out_norm: Norm,
}

/// The encoder without candle, where the CPU runs loomem's kernels
/// ([`int8`] or [`bf16`], and [`nn`]). A pass lays its texts' tokens end to end, with no
/// padding: the dense layers and norms work token by token, and attention
/// keeps to each text's own tokens.
struct Native {
    layers: Vec<NativeLayer>,
    embed_norm: Norm,
    eps: f32,
}

impl Encoder {
    fn load(dir: &Path, cfg: &BertConfig, precision: Precision) -> CandleResult<Encoder> {
        let device = Device::Cpu;
        let weights = dir.join("model.safetensors");
        // SAFETY: the file is memory-mapped read-only and never modified while loaded.
        let vb = unsafe { VarBuilder::from_mmaped_safetensors(&[weights], DType::F32, &device)? };
        let h = cfg.hidden_size;
        let eps = cfg.layer_norm_eps;
        let emb = vb.pp("embeddings");
        let token_types = embedding(cfg.type_vocab_size, h, emb.pp("token_type_embeddings"))?;
        let native = Native::load(&vb, cfg, precision)?;
        // candle's layers only where the native encoder cannot run.
        let layers = (0..cfg.num_hidden_layers * usize::from(native.is_none()))
            .map(|i| {
                let l = vb.pp(format!("encoder.layer.{i}"));
                let attn = l.pp("attention");
                Ok(Layer {
                    query: Dense::load(h, h, attn.pp("self.query"))?,
                    key: Dense::load(h, h, attn.pp("self.key"))?,
                    value: Dense::load(h, h, attn.pp("self.value"))?,
                    attn_out: Dense::load(h, h, attn.pp("output.dense"))?,
                    attn_norm: layer_norm(h, eps, attn.pp("output.LayerNorm"))?,
                    intermediate: Dense::load(
                        h,
                        cfg.intermediate_size,
                        l.pp("intermediate.dense"),
                    )?,
                    out: Dense::load(cfg.intermediate_size, h, l.pp("output.dense"))?,
                    out_norm: layer_norm(h, eps, l.pp("output.LayerNorm"))?,
                })
            })
            .collect::<CandleResult<Vec<_>>>()?;
        Ok(Encoder {
            words: embedding(cfg.vocab_size, h, emb.pp("word_embeddings"))?,
            positions: embedding(
                cfg.max_position_embeddings,
                h,
                emb.pp("position_embeddings"),
            )?,
            // Sentences are single segments: every token has type 0.
            token_type0: token_types.embeddings().get(0)?,
            embed_norm: layer_norm(h, eps, emb.pp("LayerNorm"))?,
            layers,
            heads: cfg.num_attention_heads,
            head_dim: h / cfg.num_attention_heads,
            hidden: h,
            device,
            native,
        })
    }

    /// Unit-length sentence vectors for one padded batch.
    /// `ids` and `mask` are `[batch, len]` row-major.
    fn embed(
        &self,
        ids: &[u32],
        mask: &[u32],
        batch: usize,
        len: usize,
    ) -> CandleResult<Vec<Vec<f32>>> {
        let ids = Tensor::from_slice(ids, (batch, len), &self.device)?;
        let mask = Tensor::from_slice(mask, (batch, len), &self.device)?.to_dtype(DType::F32)?;
        let positions = Tensor::arange(0u32, len as u32, &self.device)?;
        let mut x = self
            .words
            .forward(&ids)?
            .broadcast_add(&self.positions.forward(&positions)?)?
            .broadcast_add(&self.token_type0)?;
        x = self.embed_norm.forward(&x)?;
        // Padding keys get a large negative score before the softmax: [batch, 1, 1, len].
        let bias = ((mask.clone() - 1.0)? * 1e9)?.reshape((batch, 1, 1, len))?;
        let scale = 1.0 / (self.head_dim as f64).sqrt();
        for layer in &self.layers {
            let heads = |lin: &Dense| -> CandleResult<Tensor> {
                lin.forward(&x)?
                    .reshape((batch, len, self.heads, self.head_dim))?
                    .transpose(1, 2)?
                    .contiguous()
            };
            let q = heads(&layer.query)?;
            let k = heads(&layer.key)?;
            let v = heads(&layer.value)?;
            let scores = (q.matmul(&k.t()?.contiguous()?)? * scale)?.broadcast_add(&bias)?;
            let probs = candle_nn::ops::softmax_last_dim(&scores)?;
            let context = probs.matmul(&v)?.transpose(1, 2)?.contiguous()?.reshape((
                batch,
                len,
                self.hidden,
            ))?;
            let attended = layer
                .attn_norm
                .forward(&(layer.attn_out.forward(&context)? + &x)?)?;
            let inner = layer.intermediate.forward_gelu(&attended)?;
            x = layer
                .out_norm
                .forward(&(layer.out.forward(&inner)? + &attended)?)?;
        }
        // Mean over real tokens, then L2 normalisation.
        let summed = x.broadcast_mul(&mask.unsqueeze(2)?)?.sum(1)?;
        let counts = mask.sum_keepdim(1)?.clamp(1e-9, f64::MAX)?;
        let mean = summed.broadcast_div(&counts)?;
        let norms = mean.sqr()?.sum_keepdim(1)?.sqrt()?.clamp(1e-12, f64::MAX)?;
        mean.broadcast_div(&norms)?.to_vec2::<f32>()
    }
}

/// A tensor's values, row-major.
fn values(t: &Tensor) -> CandleResult<Vec<f32>> {
    t.flatten_all()?.to_vec1()
}

impl Native {
    /// The layers packed for the int8 kernels (`precision` int8, where the
    /// CPU has AVX-512 VNNI or AVX2) or the bf16 ones, or None where neither
    /// can run or the heads are of another size.
    fn load(
        vb: &VarBuilder,
        cfg: &BertConfig,
        precision: Precision,
    ) -> CandleResult<Option<Native>> {
        let (h, inner) = (cfg.hidden_size, cfg.intermediate_size);
        let in_int8 = precision == Precision::Int8 && int8::supported();
        if !(in_int8 || bf16::supported())
            || !nn::HEAD_DIMS.contains(&(h / cfg.num_attention_heads.max(1)))
        {
            return Ok(None);
        }
        let dense = |inputs: usize, outputs: usize, vb: VarBuilder| -> CandleResult<_> {
            Ok((
                values(&vb.get((outputs, inputs), "weight")?)?,
                vb.get(outputs, "bias")?.to_vec1::<f32>()?,
            ))
        };
        let pack = |(w, b): (Vec<f32>, Vec<f32>)| -> CandleResult<Box<dyn Packed>> {
            let layer: Option<Box<dyn Packed>> = if in_int8 {
                int8::Linear::new(&w, &b).map(|l| Box::new(l) as _)
            } else {
                bf16::Linear::new(&w, &b).map(|l| Box::new(l) as _)
            };
            layer.ok_or_else(|| {
                candle_core::Error::Msg("a dense layer's shape does not pack".into())
            })
        };
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for i in 0..cfg.num_hidden_layers {
            let l = vb.pp(format!("encoder.layer.{i}"));
            let attn = l.pp("attention");
            let (mut w, mut b) = (Vec::new(), Vec::new());
            for part in ["query", "key", "value"] {
                let (pw, pb) = dense(h, h, attn.pp("self").pp(part))?;
                w.extend(pw);
                b.extend(pb);
            }
            layers.push(NativeLayer {
                qkv: pack((w, b))?,
                attn_out: pack(dense(h, h, attn.pp("output.dense"))?)?,
                attn_norm: Norm::load(h, attn.pp("output.LayerNorm"))?,
                intermediate: pack(dense(h, inner, l.pp("intermediate.dense"))?)?,
                out: pack(dense(inner, h, l.pp("output.dense"))?)?,
                out_norm: Norm::load(h, l.pp("output.LayerNorm"))?,
            });
        }
        Ok(Some(Native {
            layers,
            embed_norm: Norm::load(h, vb.pp("embeddings.LayerNorm"))?,
            eps: cfg.layer_norm_eps as f32,
        }))
    }
}

impl Encoder {
    /// Unit-length sentence vectors for texts given as token ids, run by the
    /// [`Native`] kernels: the tokens end to end, no padding.
    fn embed_native(&self, native: &Native, texts: &[&[u32]]) -> CandleResult<Vec<Vec<f32>>> {
        let h = self.hidden;
        let mut spans = Vec::with_capacity(texts.len());
        let mut ids = Vec::new();
        let mut positions = Vec::new();
        for t in texts {
            spans.push(ids.len()..ids.len() + t.len());
            ids.extend_from_slice(t);
            positions.extend(0..t.len() as u32);
        }
        let tokens = ids.len();
        let words = self
            .words
            .forward(&Tensor::from_vec(ids, tokens, &self.device)?)?;
        let at = self
            .positions
            .forward(&Tensor::from_vec(positions, tokens, &self.device)?)?;
        let mut x = values(&words.broadcast_add(&self.token_type0)?)?;
        let at = values(&at)?;
        let norm = |x: &mut [f32], add: &[f32], n: &Norm| {
            nn::add_layer_norm(x, add, &n.gamma, &n.beta, native.eps)
        };
        norm(&mut x, &at, &native.embed_norm);
        PASS.with_borrow_mut(|b| {
            b.context.resize(tokens * h, 0.0);
            for layer in &native.layers {
                layer.qkv.forward_into(&x, &mut b.qkv, &mut b.xs);
                // Every token's every head is written.
                nn::attention(&b.qkv, h, self.heads, &spans, &mut b.context);
                layer
                    .attn_out
                    .forward_into(&b.context, &mut b.attended, &mut b.xs);
                norm(&mut b.attended, &x, &layer.attn_norm);
                layer
                    .intermediate
                    .forward_into(&b.attended, &mut b.inner, &mut b.xs);
                nn::gelu_erf(&mut b.inner);
                layer.out.forward_into(&b.inner, &mut b.next, &mut b.xs);
                norm(&mut b.next, &b.attended, &layer.out_norm);
                std::mem::swap(&mut x, &mut b.next);
            }
            if b.inner.capacity() > PASS_KEPT_FLOATS {
                *b = PassBuffers::default();
            }
        });
        // Mean over each text's tokens, then L2 normalisation.
        Ok(spans
            .iter()
            .map(|span| {
                let mut mean = vec![0.0f32; h];
                for row in x[span.start * h..span.end * h].chunks_exact(h) {
                    for (m, v) in mean.iter_mut().zip(row) {
                        *m += v;
                    }
                }
                vector::l2_normalize(&mut mean);
                mean
            })
            .collect())
    }
}

/// A native pass's working rows, kept by each inference thread from pass to
/// pass: fresh ones cost page faults and zeroing, a tenth of a long pass.
#[derive(Default)]
struct PassBuffers {
    qkv: Vec<f32>,
    context: Vec<f32>,
    attended: Vec<f32>,
    inner: Vec<f32>,
    next: Vec<f32>,
    xs: Vec<u32>,
}

thread_local! {
    static PASS: std::cell::RefCell<PassBuffers> = std::cell::RefCell::default();
}

/// The largest feed-forward buffer a thread keeps after its pass (16 MiB,
/// about 2,700 tokens; with the other rows, about 45 MiB a thread at most);
/// a bigger pass's buffers are let go.
const PASS_KEPT_FLOATS: usize = 4 << 20;

/// Everything one inference pass needs; owned by the inference thread.
struct Model {
    tokenizer: Tokenizer,
    encoder: Encoder,
    batch_size: usize,
    /// How the thread spreads its work: sub-batches side by side.
    layout: Layout,
}

/// An inference thread's CPUs: `workers` sub-batches at once, each running
/// its kernels on a thread of its own named `{name}-{worker}.0`.
#[derive(Debug, Clone, Copy)]
struct Layout {
    name: &'static str,
    workers: usize,
}

impl Layout {
    /// One rayon pool of one thread per worker, created by the calling
    /// thread (so they inherit its priority). candle's matrix multiplies
    /// split over the pool they run in: a pool of one runs the pieces in
    /// turn, with no other thread to wait for.
    fn pools(self) -> Result<Vec<rayon::ThreadPool>, EmbedError> {
        let name = self.name;
        (0..self.workers.max(1))
            .map(|w| {
                rayon::ThreadPoolBuilder::new()
                    .num_threads(1)
                    .thread_name(move |t| format!("{name}-{w}.{t}"))
                    .build()
                    .map_err(|e| {
                        EmbedError::Provider(format!("cannot start the kernel threads: {e}"))
                    })
            })
            .collect()
    }
}

impl Model {
    fn embed_all(
        &self,
        pools: &[rayon::ThreadPool],
        texts: &[String],
    ) -> Result<Vec<Vec<f32>>, EmbedError> {
        let started = std::time::Instant::now();
        // Text by text on this thread: `encode_batch` shares the texts out
        // over rayon's global pool, whose threads then spin a while on the
        // CPUs the kernels are about to need.
        let encodings = texts
            .iter()
            .map(|t| self.tokenizer.encode(t.as_str(), true))
            .collect::<Result<Vec<_>, _>>()
            .map_err(EmbedError::tokenizer)?;
        // Shortest first, so each sub-batch pads to a length close to its
        // members'; the cuts balance the threads' work (see [`sub_batches`]).
        // The native kernels do not pad: a pass that fits in one sub-batch
        // a thread is shared out text by text instead ([`shared_out`]).
        let mut order: Vec<usize> = (0..texts.len()).collect();
        order.sort_by_key(|&i| encodings[i].get_ids().len());
        let lens: Vec<usize> = order
            .iter()
            .map(|&i| encodings[i].get_ids().len())
            .collect();
        let groups: Vec<Vec<usize>> =
            if self.encoder.native.is_some() && lens.len() <= pools.len() * self.batch_size {
                shared_out(&lens, pools.len(), self.batch_size)
                    .into_iter()
                    .map(|g| g.into_iter().map(|at| order[at]).collect())
                    .collect()
            } else {
                sub_batches(&lens, pools.len(), self.batch_size)
                    .into_iter()
                    .map(|r| order[r].to_vec())
                    .collect()
            };
        let tokenized = started.elapsed();
        type Vectors = Result<Vec<Vec<f32>>, EmbedError>;
        let run = |group: &[usize]| -> Vectors {
            if let Some(native) = &self.encoder.native {
                let texts: Vec<&[u32]> = group.iter().map(|&i| encodings[i].get_ids()).collect();
                return self
                    .encoder
                    .embed_native(native, &texts)
                    .map_err(|e| EmbedError::Provider(format!("minilm: {e}")));
            }
            let len = group
                .iter()
                .map(|&i| encodings[i].get_ids().len())
                .max()
                .unwrap_or(0)
                .max(1);
            let mut ids = vec![0u32; group.len() * len];
            let mut mask = vec![0u32; group.len() * len];
            for (row, &i) in group.iter().enumerate() {
                let enc = &encodings[i];
                let n = enc.get_ids().len();
                ids[row * len..row * len + n].copy_from_slice(enc.get_ids());
                mask[row * len..row * len + n].copy_from_slice(enc.get_attention_mask());
            }
            self.encoder
                .embed(&ids, &mask, group.len(), len)
                .map_err(|e| EmbedError::Provider(format!("minilm: {e}")))
        };
        // Each sub-batch's vectors, with its tokens and when it began and
        // ended (µs from the pass's start) for the pass's debug line.
        type Span = (usize, u128, u128);
        let timed = |group: &[usize]| -> (Vectors, Span) {
            let began = started.elapsed().as_micros();
            let out = run(group);
            let tokens = group.iter().map(|&i| encodings[i].get_ids().len()).sum();
            (out, (tokens, began, started.elapsed().as_micros()))
        };
        let (vectors, spans): (Vec<Vectors>, Vec<Span>) = if pools.len() <= 1 || groups.len() == 1 {
            pools[0].install(|| groups.iter().map(|g| timed(g)).unzip())
        } else {
            // Each worker takes the next sub-batch until none is left.
            let next = std::sync::atomic::AtomicUsize::new(0);
            let mut done: Vec<(usize, (Vectors, Span))> = std::thread::scope(|scope| {
                let workers: Vec<_> = pools
                    .iter()
                    .take(groups.len())
                    .map(|pool| {
                        let (next, timed, groups) = (&next, &timed, &groups);
                        scope.spawn(move || {
                            pool.install(|| {
                                let mut mine = Vec::new();
                                loop {
                                    let g = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                    let Some(group) = groups.get(g) else {
                                        return mine;
                                    };
                                    mine.push((g, timed(group)));
                                }
                            })
                        })
                    })
                    .collect();
                workers
                    .into_iter()
                    .flat_map(|w| w.join().expect("inference worker panicked"))
                    .collect()
            });
            done.sort_by_key(|(g, _)| *g);
            done.into_iter().map(|(_, v)| v).unzip()
        };
        tracing::debug!(
            texts = texts.len(),
            tokenized_us = tokenized.as_micros(),
            sub_batches = ?spans,
            pass_us = started.elapsed().as_micros(),
            "embedding pass (each sub-batch: tokens, began and ended, µs)"
        );
        let mut out = vec![Vec::new(); texts.len()];
        for (group, vectors) in groups.iter().zip(vectors) {
            for (&i, v) in group.iter().zip(vectors?) {
                out[i] = v;
            }
        }
        Ok(out)
    }
}

/// What a forward pass of `rows` texts padded to `len` tokens costs, in
/// MiniLM's multiply-adds per layer over 768: each token's projections and
/// feed-forward (4·384² + 2·384·1536 ≈ 2,304 · 768) plus its attention over
/// the `len` tokens of its row (2·384·len = len · 768).
fn pass_cost(rows: usize, len: usize) -> u64 {
    (rows * len * (2_304 + len)) as u64
}

/// What one text of `len` tokens costs on the native kernels, in
/// [`pass_cost`]'s units: its tokens end to end with the others', unpadded,
/// and its attention over its own tokens.
fn text_cost(len: usize) -> u64 {
    pass_cost(1, len)
}

/// How a native pass's texts, their token counts sorted ascending in `lens`,
/// are shared among `threads` sub-batches of at most `cap` texts, when they
/// fit in one a thread (positions in `lens`, the costliest sub-batch
/// first). The kernels pad nothing, so any texts may go together: each
/// text, the costliest first, joins the sub-batch with the least work so far
/// that has room. Contiguous runs priced as if padded ([`sub_batches`], what
/// candle needs) left one thread 2.5 ms a pass of 8 chat turns (20 ms) with
/// nothing to do, at the median.
fn shared_out(lens: &[usize], threads: usize, cap: usize) -> Vec<Vec<usize>> {
    let (threads, cap) = (threads.max(1).min(lens.len()), cap.max(1));
    let mut groups: Vec<(u64, Vec<usize>)> = vec![(0, Vec::new()); threads];
    for (at, &len) in lens.iter().enumerate().rev() {
        let lightest = groups
            .iter_mut()
            .filter(|(_, g)| g.len() < cap)
            .min_by_key(|(work, _)| *work)
            .expect("the texts fit in one sub-batch a thread");
        lightest.0 += text_cost(len);
        lightest.1.push(at);
    }
    groups.sort_by_key(|(work, _)| std::cmp::Reverse(*work));
    groups.into_iter().map(|(_, g)| g).collect()
}

/// How a pass's texts, their token counts sorted ascending in `lens`, are cut
/// into sub-batches: contiguous runs of at most `cap` texts, each padded to
/// its longest, listed costliest first (the threads take them in this order).
///
/// A pass that fits in one sub-batch per thread is cut into exactly that many
/// runs so that the costliest run is as cheap as it can be: equal counts
/// would give the thread with the long texts most of the work while the
/// other waits (8 chat turns of 20–150 tokens cut 4 + 4 cost about four
/// times as much on the long side). A larger pass is cut every `cap` texts;
/// with many runs, taking the costliest first keeps the threads' ends close.
fn sub_batches(lens: &[usize], threads: usize, cap: usize) -> Vec<std::ops::Range<usize>> {
    let n = lens.len();
    let (threads, cap) = (threads.max(1), cap.max(1));
    let cost = |r: &std::ops::Range<usize>| pass_cost(r.len(), lens[r.end - 1]);
    let mut runs: Vec<std::ops::Range<usize>> = if n == 0 {
        Vec::new()
    } else if n <= threads * cap {
        // best[g][i]: the cheapest costliest run cutting the first i texts
        // into g runs; cut[g][i] where its last run starts.
        let groups = threads.min(n);
        let mut best = vec![vec![u64::MAX; n + 1]; groups + 1];
        let mut cut = vec![vec![0usize; n + 1]; groups + 1];
        best[0][0] = 0;
        for g in 1..=groups {
            for i in g..=n {
                for k in i.saturating_sub(cap).max(g - 1)..i {
                    if best[g - 1][k] == u64::MAX {
                        continue;
                    }
                    let worst = best[g - 1][k].max(cost(&(k..i)));
                    if worst < best[g][i] {
                        best[g][i] = worst;
                        cut[g][i] = k;
                    }
                }
            }
        }
        let mut runs = Vec::with_capacity(groups);
        let mut end = n;
        for g in (1..=groups).rev() {
            let start = cut[g][end];
            runs.push(start..end);
            end = start;
        }
        runs
    } else {
        (0..n).step_by(cap).map(|s| s..(s + cap).min(n)).collect()
    };
    runs.sort_by_key(|r| std::cmp::Reverse(cost(r)));
    runs
}

/// candle splits every matrix multiply into RAYON_NUM_THREADS pieces (else
/// one per physical core) and runs them on the rayon pool it is called from,
/// waiting for the last. MiniLM's kernels are small, so threads that share
/// the CPUs with anything else wait for each other more than they compute (a
/// third of the embedding threads' time under the ordinary workload went to
/// waiting and the scheduler when every pass used the global pool). So each
/// inference thread brings its own pools ([`Layout::pools`]) and runs its
/// sub-batches side by side, each in a pool of one thread that runs the
/// pieces in turn. A query too: split over every CPU, each of its many
/// steps waited for its slower half, and under load either half waited
/// behind the pipeline's threads (README, Benchmarks: **The query lane on
/// one CPU a query, and what a pass waits for**).
///
/// Sets RAYON_NUM_THREADS (rayon's global pool, which MiniLM's passes no
/// longer use, and the pieces candle cuts a matrix multiply into, which a
/// pool of one runs in turn) to every CPU up to four and CANDLE_NUM_THREADS
/// to 1, unless they are set. Call it before any other thread exists (it
/// writes the process environment).
pub fn kernel_threads() {
    let vars = [
        ("RAYON_NUM_THREADS", global_threads().to_string()),
        ("CANDLE_NUM_THREADS", "1".to_string()),
    ];
    for (var, value) in vars {
        if std::env::var_os(var).is_none() {
            std::env::set_var(var, value);
        }
    }
}

/// Rayon's global pool: every CPU, up to four.
fn global_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().min(4))
}

struct Job {
    texts: Vec<String>,
    reply: oneshot::Sender<Result<Vec<Vec<f32>>, EmbedError>>,
}

/// The MiniLM provider: handles to its two inference threads, one for the
/// pipeline's batches and one for search queries, so that a query never waits
/// behind a batch pass (the two share the CPU instead).
pub struct MiniLmEmbedder {
    jobs: std_mpsc::Sender<Job>,
    queries: std_mpsc::Sender<Job>,
    dim: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("the MiniLM model is missing: {path} not found. Run `bash scripts/setup.sh` (or `just setup`) to install it, or point embed.model_dir at a directory holding {files}")]
    Missing { path: PathBuf, files: String },
    #[error("cannot load the MiniLM model from {dir}: {message}")]
    Invalid { dir: PathBuf, message: String },
}

fn invalid(dir: &Path, message: String) -> LoadError {
    LoadError::Invalid {
        dir: dir.to_path_buf(),
        message,
    }
}

/// The model's configuration, once every model file is found.
fn read_config(dir: &Path) -> Result<BertConfig, LoadError> {
    for file in MODEL_FILES {
        let path = dir.join(file);
        if !path.is_file() {
            return Err(LoadError::Missing {
                path,
                files: MODEL_FILES.join(", "),
            });
        }
    }
    let cfg: BertConfig = std::fs::read_to_string(dir.join("config.json"))
        .map_err(|e| e.to_string())
        .and_then(|text| serde_json::from_str(&text).map_err(|e| e.to_string()))
        .map_err(|e| invalid(dir, format!("config.json: {e}")))?;
    if let Some(act) = cfg.hidden_act.as_deref().filter(|a| *a != "gelu") {
        return Err(invalid(
            dir,
            format!("config.json: hidden_act {act:?} is not supported (gelu only)"),
        ));
    }
    if !cfg.hidden_size.is_multiple_of(cfg.num_attention_heads) {
        return Err(invalid(
            dir,
            "config.json: hidden_size is not a multiple of num_attention_heads".into(),
        ));
    }
    Ok(cfg)
}

fn read_tokenizer(dir: &Path, cfg: &BertConfig, max_tokens: usize) -> Result<Tokenizer, LoadError> {
    let mut tokenizer = Tokenizer::from_file(dir.join("tokenizer.json"))
        .map_err(|e| invalid(dir, format!("tokenizer.json: {e}")))?;
    // The shipped tokenizer pads and truncates to a fixed 128; padding is done
    // here per sub-batch, truncation at the model's sequence limit.
    tokenizer.with_padding(None);
    tokenizer
        .with_truncation(Some(TruncationParams {
            max_length: max_tokens.min(cfg.max_position_embeddings),
            ..Default::default()
        }))
        .map_err(|e| invalid(dir, format!("tokenizer truncation: {e}")))?;
    Ok(tokenizer)
}

/// Token ids the tokenizer makes and the model has an embedding for.
fn vocab_size(tokenizer: &Tokenizer, cfg: &BertConfig) -> usize {
    tokenizer.get_vocab_size(true).min(cfg.vocab_size)
}

/// What the static embedder needs of the model: its tokenizer (truncating at
/// `max_tokens`), hidden size and vocabulary size.
pub(super) fn tokenizer(
    dir: &Path,
    max_tokens: usize,
) -> Result<(Tokenizer, usize, usize), LoadError> {
    let cfg = read_config(dir)?;
    let tokenizer = read_tokenizer(dir, &cfg, max_tokens)?;
    let vocab = vocab_size(&tokenizer, &cfg);
    Ok((tokenizer, cfg.hidden_size, vocab))
}

/// One vector per entry of the model's vocabulary: the model's own sentence
/// vector of a text that is that token alone (`[CLS] token [SEP]`,
/// mean-pooled, unit length). The static embedder is distilled from these.
/// Rows in vocabulary order, hidden-size floats each.
pub(super) fn token_vectors(dir: &Path) -> Result<Vec<f32>, LoadError> {
    let cfg = read_config(dir)?;
    let tokenizer = read_tokenizer(dir, &cfg, cfg.max_position_embeddings)?;
    // In bf16: the static table does not move with `embed.precision`.
    let encoder = Encoder::load(dir, &cfg, Precision::Bf16)
        .map_err(|e| invalid(dir, format!("model.safetensors: {e}")))?;
    let special = |t: &str| {
        tokenizer
            .token_to_id(t)
            .ok_or_else(|| invalid(dir, format!("tokenizer.json: no {t} token")))
    };
    let (cls, sep) = (special("[CLS]")?, special("[SEP]")?);
    let vocab = vocab_size(&tokenizer, &cfg) as u32;
    let mut rows = Vec::with_capacity(vocab as usize * cfg.hidden_size);
    const PASS: u32 = 512;
    for start in (0..vocab).step_by(PASS as usize) {
        let ids: Vec<u32> = (start..(start + PASS).min(vocab))
            .flat_map(|t| [cls, t, sep])
            .collect();
        let mask = vec![1u32; ids.len()];
        let vectors = encoder
            .embed(&ids, &mask, ids.len() / 3, 3)
            .map_err(|e| invalid(dir, format!("distilling token vectors: {e}")))?;
        rows.extend(vectors.into_iter().flatten());
    }
    Ok(rows)
}

impl MiniLmEmbedder {
    /// Load the model from `dir` and start the inference thread.
    /// `max_tokens` truncates longer texts; `batch_size` bounds one forward
    /// pass; `precision` is the dense layers' arithmetic; `batch_niceness`
    /// is the nice value of the threads that run the pipeline's passes (see
    /// `embed.batch_niceness`; queries always run at the process's own).
    pub fn load(
        dir: &Path,
        max_tokens: usize,
        batch_size: usize,
        precision: Precision,
        batch_niceness: i32,
    ) -> Result<MiniLmEmbedder, LoadError> {
        let cfg = read_config(dir)?;
        let start = |name: &str,
                     layout: Layout,
                     niceness: i32|
         -> Result<std_mpsc::Sender<Job>, LoadError> {
            let model = Model {
                tokenizer: read_tokenizer(dir, &cfg, max_tokens)?,
                encoder: Encoder::load(dir, &cfg, precision)
                    .map_err(|e| invalid(dir, format!("model.safetensors: {e}")))?,
                batch_size: batch_size.max(1),
                layout,
            };
            let (tx, rx) = std_mpsc::channel::<Job>();
            std::thread::Builder::new()
                .name(name.into())
                .spawn(move || serve(model, rx, niceness))
                .map_err(|e| invalid(dir, format!("cannot start the inference thread: {e}")))?;
            Ok(tx)
        };
        // Every CPU through sub-batches, each on kernels of one thread.
        let layout = |name| Layout {
            name,
            workers: std::thread::available_parallelism().map_or(1, |n| n.get()),
        };
        Ok(MiniLmEmbedder {
            jobs: start("loomem-minilm", layout("loomem-bulk"), batch_niceness)?,
            queries: start("loomem-minilm-query", layout("loomem-qry"), 0)?,
            dim: cfg.hidden_size,
        })
    }
}

/// Most texts one merged pass takes from queued calls.
const MERGE_LIMIT: usize = 1024;

fn serve(model: Model, rx: std_mpsc::Receiver<Job>, niceness: i32) {
    crate::core::thread::lower_priority(niceness);
    // After the priority is set: the pools' threads inherit it.
    let pools = match model.layout.pools() {
        Ok(pools) => pools,
        Err(e) => {
            tracing::error!(error = %e, "the MiniLM inference thread cannot run");
            while let Ok(job) = rx.recv() {
                let _ = job.reply.send(Err(EmbedError::Provider(e.to_string())));
            }
            return;
        }
    };
    while let Ok(first) = rx.recv() {
        let mut jobs = vec![first];
        let mut total = jobs[0].texts.len();
        while total < MERGE_LIMIT {
            match rx.try_recv() {
                Ok(job) => {
                    total += job.texts.len();
                    jobs.push(job);
                }
                Err(_) => break,
            }
        }
        let lens: Vec<usize> = jobs.iter().map(|j| j.texts.len()).collect();
        let texts: Vec<String> = jobs
            .iter_mut()
            .flat_map(|j| std::mem::take(&mut j.texts))
            .collect();
        match model.embed_all(&pools, &texts) {
            Ok(mut vectors) => {
                for (job, len) in jobs.into_iter().zip(lens).rev() {
                    let rest = vectors.split_off(vectors.len() - len);
                    let _ = job.reply.send(Ok(rest));
                }
            }
            Err(e) => {
                for job in jobs {
                    let _ = job.reply.send(Err(EmbedError::Provider(e.to_string())));
                }
            }
        }
    }
}

impl Embedder for MiniLmEmbedder {
    fn model(&self) -> &str {
        MODEL_NAME
    }

    fn dim(&self) -> usize {
        self.dim
    }

    fn embed<'a>(
        &'a self,
        texts: &'a [String],
    ) -> BoxFuture<'a, Result<Vec<Vec<f32>>, EmbedError>> {
        Box::pin(async move {
            if texts.is_empty() {
                return Ok(Vec::new());
            }
            run(&self.jobs, texts.to_vec()).await
        })
    }

    fn embed_query<'a>(&'a self, text: &'a str) -> BoxFuture<'a, Result<Vec<f32>, EmbedError>> {
        Box::pin(async move {
            run(&self.queries, vec![text.to_string()])
                .await?
                .pop()
                .ok_or_else(|| EmbedError::Provider("no vector for the query".into()))
        })
    }
}

/// Hand `texts` to an inference thread and wait for their vectors.
async fn run(
    thread: &std_mpsc::Sender<Job>,
    texts: Vec<String>,
) -> Result<Vec<Vec<f32>>, EmbedError> {
    let stopped = || EmbedError::Provider("the MiniLM inference thread has stopped".into());
    let (reply, rx) = oneshot::channel();
    thread.send(Job { texts, reply }).map_err(|_| stopped())?;
    rx.await.map_err(|_| stopped())?
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every text in exactly one run, runs contiguous and at most `cap` long.
    fn check_cover(lens: &[usize], runs: &[std::ops::Range<usize>], cap: usize) {
        let mut sorted = runs.to_vec();
        sorted.sort_by_key(|r| r.start);
        let mut next = 0;
        for r in &sorted {
            assert_eq!(r.start, next, "runs leave a gap or overlap: {runs:?}");
            assert!(!r.is_empty() && r.len() <= cap, "run {r:?} over cap {cap}");
            next = r.end;
        }
        assert_eq!(next, lens.len());
    }

    fn worst(lens: &[usize], runs: &[std::ops::Range<usize>]) -> u64 {
        runs.iter()
            .map(|r| pass_cost(r.len(), lens[r.end - 1]))
            .max()
            .unwrap_or(0)
    }

    #[test]
    fn a_small_pass_is_cut_where_the_threads_work_alike() {
        // Eight chat turns, short to long: equal counts would put 4 × 150
        // tokens on one thread against 4 × 40 on the other.
        let lens = [20, 25, 30, 40, 50, 60, 90, 150];
        let runs = sub_batches(&lens, 2, 32);
        check_cover(&lens, &runs, 32);
        assert_eq!(runs.len(), 2);
        let halves = [0..4, 4..8];
        assert!(worst(&lens, &runs) < worst(&lens, &halves));
        // The cut is the best of every possible one.
        let best = (1..lens.len())
            .map(|k| worst(&lens, &[0..k, k..lens.len()]))
            .min()
            .unwrap();
        assert_eq!(worst(&lens, &runs), best);
        // Costliest first.
        assert!(worst(&lens, &runs[..1]) >= worst(&lens, &runs[1..]));
    }

    #[test]
    fn a_native_pass_is_shared_out_by_each_texts_own_cost() {
        let work = |lens: &[usize], g: &[usize]| g.iter().map(|&at| text_cost(lens[at])).sum();
        let heaviest = |lens: &[usize], groups: &[Vec<usize>]| -> u64 {
            groups.iter().map(|g| work(lens, g)).max().unwrap_or(0)
        };
        // Eight chat turns: the best contiguous cut leaves one thread far
        // more tokens than the other; shared out, they are within a text.
        let lens = [20, 25, 30, 40, 50, 60, 90, 150];
        let groups = shared_out(&lens, 2, 32);
        let contiguous: Vec<Vec<usize>> = sub_batches(&lens, 2, 32)
            .into_iter()
            .map(|r| r.collect())
            .collect();
        let total: u64 = lens.iter().map(|&l| text_cost(l)).sum();
        assert!(heaviest(&lens, &groups) < heaviest(&lens, &contiguous));
        assert!(heaviest(&lens, &groups) - total / 2 <= text_cost(20));
        // Costliest first.
        assert!(work(&lens, &groups[0]) >= work(&lens, &groups[1]));
        // Every text once, no group over the cap, no group empty.
        for (n, threads, cap) in [(1, 2, 32), (3, 4, 32), (8, 2, 4), (64, 2, 32), (7, 1, 32)] {
            let lens: Vec<usize> = (0..n).map(|i| 5 + (i * 37) % 250).collect();
            let groups = shared_out(&lens, threads, cap);
            assert_eq!(groups.len(), threads.min(n));
            let mut seen: Vec<usize> = groups.concat();
            seen.sort();
            assert_eq!(seen, (0..n).collect::<Vec<_>>());
            assert!(groups.iter().all(|g| !g.is_empty() && g.len() <= cap));
        }
    }

    #[test]
    fn cuts_respect_the_cap_and_cover_every_text() {
        for (n, threads, cap) in [
            (0, 2, 32),
            (1, 2, 32),
            (3, 4, 32),
            (8, 2, 3),
            (64, 2, 32),
            (65, 2, 32),
            (200, 2, 32),
            (7, 1, 32),
        ] {
            let mut lens: Vec<usize> = (0..n).map(|i| 5 + (i * 37) % 250).collect();
            lens.sort();
            let runs = sub_batches(&lens, threads, cap);
            check_cover(&lens, &runs, cap);
            if n > 0 && n <= threads * cap {
                assert_eq!(runs.len(), threads.min(n), "n {n} threads {threads}");
            }
            for w in runs.windows(2) {
                assert!(
                    worst(&lens, &w[..1]) >= worst(&lens, &w[1..]),
                    "not costliest first: {runs:?}"
                );
            }
        }
    }
}
