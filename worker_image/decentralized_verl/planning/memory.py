"""Per-worker memory estimates in bytes, from a model's shape and the job's sizes. Pure arithmetic.

Each estimate is a list of `Component`s. A component is held for the whole run (`phase="always"`: weights,
gradients, optimizer state) or only during one phase (`"update"`, `"generation"`, `"scoring"`: activations,
logits, KV caches); a worker's peak is what is always held plus its largest phase, since a colocated
rollout's KV cache and the update's activations never live at the same time.

What is assumed, each matching how this runtime trains (training/trainer.py, core/forward.py):
- Weights, gradients and AdamW's two moments are in `model.dtype`: the model is trained in its own dtype
  (torch's AdamW keeps `exp_avg`/`exp_avg_sq` like the parameter), no fp32 master copy. LoRA adapters are
  fp32 (peft's default under a 16-bit model), so are their gradients and moments.
- Saved activations are counted tensor by tensor for a Llama decoder layer under PyTorch's SDPA attention
  (per query token: both RMSNorms' fp32 inputs and scaled copies, the attention and MLP inputs, q, the
  attention output and the o_proj input, the MLP's gate, SiLU, up and down inputs; per key position: keys
  and values repeated to every query head, which SDPA does under a padding mask; per forward pass: the
  additive attention mask). With LoRA, frozen linears and norms save no inputs; each adapter saves its
  input and its rank-wide A output. A test checks this count against the tensors autograd actually saves.
- Activation checkpointing keeps each layer's input and recomputes one layer at a time.
- A backward makes each parameter's gradient before adding it to the accumulated `.grad`: the largest
  (the embedding's) is counted once more.
- Logits exist at response tokens only: the LM head's output in fp32, its log-softmax (kept for the
  backward) and the two gradients the backward makes, 12 bytes per (token, vocabulary entry); an entropy
  bonus adds 8 more.
- The micro-batch is at the job's longest prompt and response. On a CPU the learner always takes the
  shared-prompt forward (each distinct prompt once, its keys and values copied to every sample of the
  group); on a GPU it may take the model's own call over the padded batch, the larger of the two.
- fsdp (FSDP2) splits weights, gradients and optimizer state over the learners, and all-gathers the root
  module (embeddings, final norm, LM head) for the whole step plus two decoder layers at a time (one
  prefetched), and holds the root's and one layer's unsharded gradients before their reduce-scatter.
  cpuOffload moves the sharded weights, gradients and optimizer state to host memory.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from decentralized_verl.planning import quantized as q4
from decentralized_verl.planning.devices import GIB
from decentralized_verl.planning.shapes import ModelShape

Device = Literal["gpu", "host"]

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
LOGIT_BYTES = 12
"""Per (response token, vocabulary entry): fp32 log-softmax output plus the backward's two fp32 gradients."""
ENTROPY_BYTES = 8
"""Per (response token, vocabulary entry) more with an entropy bonus: exp(log p) and its product."""
GPU_RUNTIME = 1 * GIB
"""CUDA context, cuBLAS/cuDNN workspaces and the caching allocator's slack, per GPU process."""
HOST_RUNTIME = GIB // 2
"""A worker process before it holds a model: Python, torch, transformers, gRPC (measured: ~0.4 GiB)."""


@dataclass(frozen=True)
class Component:
    name: str
    bytes: int
    device: Device
    phase: str = "always"
    detail: str = ""


def peak_bytes(components: Iterable[Component], device: Device) -> int:
    """What is always held on `device` plus its largest phase."""
    held = 0
    phases: dict[str, int] = {}
    for c in components:
        if c.device != device:
            continue
        if c.phase == "always":
            held += c.bytes
        else:
            phases[c.phase] = phases.get(c.phase, 0) + c.bytes
    return held + max(phases.values(), default=0)


@dataclass(frozen=True)
class Pass:
    """One forward call of the decoder: `rows` sequences, each with `queries` new tokens attending over
    `keys` positions."""

    rows: int
    queries: int
    keys: int


@dataclass(frozen=True)
class MicroBatch:
    prompts: int
    """Distinct prompts (GRPO groups share one)."""
    rows: int
    """Sequences (samples)."""
    prompt_tokens: int
    response_tokens: int
    shared_prompt: bool
    """The shared-prompt forward (each prompt once); else the model's own call over the padded rows."""

    @property
    def response_positions(self) -> int:
        return self.rows * self.response_tokens

    def passes(self) -> list[Pass]:
        p, r = self.prompt_tokens, self.response_tokens
        if not self.shared_prompt or self.prompts >= self.rows or r < 2:
            return [Pass(self.rows, p + r, p + r)]
        return [Pass(self.prompts, p, p), Pass(self.rows, r - 1, p + r - 1)]

    def positions(self) -> int:
        return sum(one.rows * one.queries for one in self.passes())


@dataclass(frozen=True)
class Trainable:
    """What trains: the whole model (`lora_rank` 0), or LoRA adapters on `lora_targets`."""

    lora_rank: int = 0
    lora_targets: tuple[str, ...] = ()

    @property
    def full(self) -> bool:
        return self.lora_rank == 0

    def trains(self, module: str) -> bool:
        return self.full or module in self.lora_targets


FULL = Trainable()


def token_layer_bytes(shape: ModelShape, b: int, trainable: Trainable = FULL) -> int:
    """Bytes one decoder layer saves for the backward per query token (keys and values not included)."""
    h, i, q = shape.hidden, shape.intermediate, shape.q_dim
    norm = 4 * h + (b * h if trainable.full else 0)  # fp32 input; scaled copy when the weight trains
    total = 2 * norm + b * 2 * q + 4 * shape.heads  # + q, the attention output, its log-sum-exp
    total += 3 * b * i  # gate (SiLU's input), SiLU output and up (the product's inputs)
    # A linear saves its input only when it trains. LoRA adapters are fp32 (peft's default): each
    # adapter saves its input in fp32 (its own cast copy under a 16-bit model) and its rank-wide output.
    inputs = {
        "q_proj": h,
        "k_proj": h,
        "v_proj": h,
        "o_proj": q,
        "gate_proj": h,
        "up_proj": h,
        "down_proj": i,
    }
    groups = (("q_proj", "k_proj", "v_proj"), ("o_proj",), ("gate_proj", "up_proj"), ("down_proj",))
    for group in groups:
        trained = [m for m in group if trainable.trains(m)]
        if not trained:
            continue
        size = inputs[group[0]]
        if trainable.full:
            total += b * size
        elif b == 4:
            total += 4 * size
        else:
            total += 4 * size * len(trained)
    if not trainable.full:
        total += 4 * trainable.lora_rank * len(shape.lora_inputs(trainable.lora_targets))
    return total


def key_layer_bytes(shape: ModelShape, b: int) -> int:
    """Bytes one decoder layer saves per key position of a row: keys and values at every query head."""
    return 2 * b * shape.q_dim


def saved_activation_bytes(
    shape: ModelShape, b: int, micro: MicroBatch, trainable: Trainable = FULL, checkpointing: bool = False
) -> int:
    """What the forward of one micro-batch keeps for its backward (logits not included)."""
    per_layer = 0
    masks = 0
    final_norm = 0
    for one in micro.passes():
        per_layer += one.rows * (
            one.queries * token_layer_bytes(shape, b, trainable) + one.keys * key_layer_bytes(shape, b)
        )
        masks += one.rows * one.queries * one.keys * b
        final_norm += (
            one.rows * one.queries * (4 * shape.hidden + (b * shape.hidden if trainable.full else 0))
        )
    head_input = micro.response_positions * b * shape.hidden if trainable.full else 0
    if not checkpointing:
        return shape.layers * per_layer + masks + final_norm + head_input
    layer_inputs = shape.layers * micro.positions() * b * shape.hidden
    cache = 0
    if len(micro.passes()) > 1:  # the shared prompt's keys and values, copied to each row, are kept
        cache = shape.layers * micro.rows * micro.prompt_tokens * 2 * b * shape.kv_dim
    return layer_inputs + cache + per_layer + masks + final_norm + head_input


def logit_bytes(shape: ModelShape, micro: MicroBatch, entropy: bool = False) -> int:
    return micro.response_positions * shape.vocab * (LOGIT_BYTES + (ENTROPY_BYTES if entropy else 0))


def kv_cache_bytes(shape: ModelShape, b: int, sequences: int, length: int, tensor_parallel: int = 1) -> int:
    """Keys and values of every layer for `sequences` of `length` tokens; tensor parallelism splits the
    KV heads (a head is never split, so fewer heads than GPUs are replicated)."""
    heads = max(1, -(-shape.kv_heads // tensor_parallel))
    return sequences * length * shape.layers * 2 * heads * shape.head_dim * b


def layer_transient_bytes(shape: ModelShape, b: int, tokens: int) -> int:
    """One layer's largest temporaries in a forward without grad (the MLP's gate, up and product, plus the
    attention's q, k, v and output)."""
    return tokens * b * (3 * shape.intermediate + 2 * shape.q_dim + 2 * shape.kv_dim)


# ------------------------------------------------------------------------------------------- roles


@dataclass(frozen=True)
class TrainingSetup:
    """How a training role holds its model: what the spec says about its sharding and memory savings."""

    dtype_bytes: int
    trainable: Trainable = FULL
    shards: int = 1
    """Learners the model is split over (fsdp); 1 with ddp."""
    cpu_offload: bool = False
    checkpointing: bool = False
    entropy: bool = False
    value_head: bool = False
    """A critic: a scalar head instead of the LM head's logits."""
    quantization: q4.FourBit | None = None
    """A 4-bit base under the adapters (QLoRA): planning/quantized.py."""


def weight_components(
    shape: ModelShape,
    b: int,
    device: Device,
    quantization: q4.FourBit | None,
    *,
    adapters: int = 0,
    note: str = "",
) -> list[Component]:
    """The model's weights: `b` bytes a parameter, or a 4-bit base (planning/quantized.py)."""
    extra = f" + {adapters:,} adapter params x 4 B" if adapters else ""
    if quantization is None:
        params = shape.parameters()
        return [
            Component(
                "weights", params * b + adapters * 4, device, detail=f"{params:,} params x {b} B{extra}{note}"
            )
        ]
    packed, scales, rest = q4.four_bit_bytes(shape, quantization)
    return [
        Component(
            "weights",
            packed + scales + rest + adapters * 4,
            device,
            detail=q4.weights_detail(shape, quantization) + extra + note,
        )
    ]


def training_components(
    shape: ModelShape, setup: TrainingSetup, micro: MicroBatch, on_gpu: bool
) -> list[Component]:
    """A learner's (or critic's) memory: model state always, one micro-batch's forward and backward."""
    b, n = setup.dtype_bytes, setup.shards
    params = shape.parameters()
    adapters = 0
    if not setup.trainable.full:
        adapters = shape.lora_parameters(setup.trainable.lora_rank, setup.trainable.lora_targets)
    trained = params if setup.trainable.full else adapters
    tb = b if setup.trainable.full else 4  # LoRA adapters are fp32 (peft's default under any model dtype)
    device: Device = "gpu" if on_gpu else "host"
    state: Device = "host" if setup.cpu_offload else device
    split = f" / {n} learners (fsdp)" if n > 1 else ""
    if setup.quantization is not None:
        out = weight_components(shape, b, state, setup.quantization, adapters=adapters)
        b = q4.HIDDEN_BYTES  # activations follow the float32 embeddings of a k-bit-prepared model
    else:
        out = [
            Component(
                "weights",
                (params * b + adapters * 4) // n,
                state,
                detail=f"{params:,} params x {b} B"
                + (f" + {adapters:,} adapter params x 4 B" if adapters else "")
                + split,
            )
        ]
    out += [
        Component(
            "gradients", trained * tb // n, state, detail=f"{trained:,} trained params x {tb} B{split}"
        ),
        Component(
            "optimizer",
            2 * trained * tb // n,
            state,
            detail=f"AdamW exp_avg + exp_avg_sq, {trained:,} x 2 x {tb} B{split}",
        ),
    ]
    if n == 1 and setup.trainable.full:
        largest = max(shape.vocab * shape.hidden, shape.hidden * shape.intermediate)
        out.append(
            Component(
                "grad temporaries",
                largest * b,
                device,
                phase="update",
                detail="a parameter-sized gradient made before it is added to .grad (the embedding's)",
            )
        )
    if n > 1:
        root = shape.embedding_parameters()
        layer = shape.layer_parameters()
        gathered = (root + 2 * layer) * b + (root + layer) * b
        out.append(
            Component(
                "fsdp gathered",
                gathered,
                device,
                phase="update",
                detail="root (embeddings, head) + 2 layers unsharded, root + 1 layer gradients",
            )
        )
    if setup.quantization is not None:
        out.append(
            Component(
                "dequantization",
                q4.dequant_bytes(shape, setup.quantization, backward=True),
                device,
                phase="update",
                detail="the largest 4-bit linear dequantized for its matmul, in the forward and the backward",
            )
        )
    trainable = setup.trainable
    activations = saved_activation_bytes(shape, b, micro, trainable, setup.checkpointing)
    how = "checkpointed, " if setup.checkpointing else ""
    out.append(
        Component(
            "activations",
            activations,
            device,
            phase="update",
            detail=f"{how}{micro.positions():,} token positions x {shape.layers} layers",
        )
    )
    if not setup.value_head:
        out.append(
            Component(
                "logits",
                logit_bytes(shape, micro, setup.entropy),
                device,
                phase="update",
                detail=f"{micro.response_positions:,} response tokens x {shape.vocab:,} vocab x "
                f"{LOGIT_BYTES + (ENTROPY_BYTES if setup.entropy else 0)} B",
            )
        )
    return out


def forward_components(
    shape: ModelShape,
    dtype_bytes: int,
    micro: MicroBatch,
    on_gpu: bool,
    *,
    logits: bool = True,
    quantization: q4.FourBit | None = None,
    own_weights: bool = True,
) -> list[Component]:
    """A frozen model answering requests (reference log-probs, a reward model's scores): weights (unless it
    computes with the learner's own, `own_weights` False), plus one micro-batch's forward without grad: its
    KV cache (the shared prompt's), one layer's temporaries and the response logits with their
    log-softmax; a 4-bit base adds its dequantized layer and computes in float32."""
    device: Device = "gpu" if on_gpu else "host"
    out = weight_components(shape, dtype_bytes, device, quantization, note=" (frozen)") if own_weights else []
    b = dtype_bytes if quantization is None else q4.HIDDEN_BYTES
    length = micro.prompt_tokens + micro.response_tokens
    transient = kv_cache_bytes(shape, b, micro.rows, length)
    transient += layer_transient_bytes(shape, b, micro.rows * length)
    if quantization is not None:
        transient += q4.dequant_bytes(shape, quantization, backward=False)
    out += [
        Component(
            "forward",
            transient,
            device,
            phase="scoring",
            detail=f"{micro.rows} rows x {length} tokens: KV cache + one layer's temporaries",
        ),
    ]
    if logits:
        out.append(
            Component(
                "logits",
                micro.response_positions * shape.vocab * (8 + b),
                device,
                phase="scoring",
                detail=f"{micro.response_positions:,} response tokens x {shape.vocab:,} vocab x {8 + b} B",
            )
        )
    return out


def runtime_components(on_gpu: bool) -> list[Component]:
    out = [Component("runtime", HOST_RUNTIME, "host", detail="Python, torch, transformers, gRPC")]
    if on_gpu:
        out.append(
            Component("cuda runtime", GPU_RUNTIME, "gpu", detail="CUDA context, workspaces, allocator slack")
        )
    return out


@dataclass(frozen=True)
class Estimate:
    """One worker's components; `gpu` and `host` are its peaks."""

    components: tuple[Component, ...] = field(default_factory=tuple)

    @property
    def gpu(self) -> int:
        return peak_bytes(self.components, "gpu")

    @property
    def host(self) -> int:
        return peak_bytes(self.components, "host")
