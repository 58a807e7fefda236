"""veRL's config keys, as data: the ones that map one to one onto the spec (`RULES`), the ones the converter
reads together with others (`HANDLED`), the ones with no counterpart and why (`DROPPED`, with `RETIRED`:
keys of veRL's last releases its current config no longer has). Flat dotted keys, as veRL's Hydra
overrides write them; `verl.py` does the converting."""

from __future__ import annotations

from decentralized_verl.convert.common import (
    KL_ESTIMATORS,
    LOSS_AGGREGATIONS,
    Rule,
    as_bool,
    as_float,
    as_int,
    lora_targets,
)

A = "actor_rollout_ref"
RC = "algorithm.rollout_correction"
OB = "reward_model.reward_kwargs.overlong_buffer_cfg"

RULES: dict[str, Rule] = {
    "data.train_batch_size": ("training.batchSize", as_int),
    "data.max_prompt_length": ("data.maxPromptTokens", as_int),
    "data.max_response_length": ("data.maxNewTokens", as_int),
    f"{A}.model.path": ("model.path", str),
    f"{A}.model.enable_gradient_checkpointing": ("roles.learner.activationCheckpointing", as_bool),
    f"{A}.model.lora_alpha": ("model.lora.alpha", as_float),
    f"{A}.model.target_modules": ("model.lora.targetModules", lora_targets),
    f"{A}.actor.optim.lr": ("training.learningRate", as_float),
    f"{A}.actor.optim.weight_decay": ("training.weightDecay", as_float),
    f"{A}.actor.optim.lr_warmup_steps": ("training.warmupSteps", lambda v: max(0, as_int(v))),
    f"{A}.actor.ppo_mini_batch_size": ("training.minibatchSize", as_int),
    f"{A}.actor.ppo_epochs": ("algorithm.ppoEpochs", as_int),
    f"{A}.actor.grad_clip": ("training.maxGradNorm", as_float),
    f"{A}.actor.entropy_coeff": ("algorithm.entropyCoef", as_float),
    f"{A}.actor.clip_ratio_low": ("algorithm.clipLow", as_float),
    f"{A}.actor.clip_ratio_high": ("algorithm.clipHigh", as_float),
    f"{A}.actor.clip_ratio_c": ("algorithm.dualClip", as_float),
    f"{A}.actor.loss_agg_mode": ("algorithm.lossAggregation", lambda v: LOSS_AGGREGATIONS[v]),
    f"{A}.actor.kl_loss_type": ("algorithm.klEstimator", lambda v: KL_ESTIMATORS[v]),
    f"{A}.actor.fsdp_config.param_offload": ("roles.learner.cpuOffload", as_bool),
    f"{A}.rollout.n": ("algorithm.samplesPerPrompt", as_int),
    f"{A}.rollout.temperature": ("data.temperature", as_float),
    f"{A}.rollout.top_p": ("data.topP", as_float),
    f"{A}.rollout.top_k": ("data.topK", lambda v: max(0, as_int(v))),
    "algorithm.gamma": ("algorithm.gamma", as_float),
    "algorithm.lam": ("algorithm.lam", as_float),
    "algorithm.norm_adv_by_std_in_grpo": ("algorithm.normAdvByStd", as_bool),
    "algorithm.kl_ctrl.kl_coef": ("algorithm.klCoef", as_float),
    "critic.optim.lr": ("training.criticLearningRate", as_float),
    "critic.cliprange_value": ("algorithm.valueClip", as_float),
    "trainer.total_epochs": ("training.epochs", as_int),
    "trainer.total_training_steps": ("training.steps", as_int),
    "trainer.save_freq": ("training.checkpoint.every", lambda v: max(0, as_int(v))),
    "trainer.test_freq": ("training.evalEvery", lambda v: max(0, as_int(v))),
    "trainer.project_name": ("training.tracking.project", str),
    "trainer.default_local_dir": ("training.checkpoint.dir", str),
    "trainer.seed": ("training.seed", as_int),
    "data.seed": ("training.seed", as_int),
}
"""Fields that map one to one (with a value conversion)."""

HANDLED = {
    "algorithm.adv_estimator": "the algorithm preset",
    "algorithm.use_kl_in_reward": "where the KL goes (algorithm.klIn)",
    f"{A}.actor.use_kl_loss": "where the KL goes (algorithm.klIn)",
    f"{A}.actor.kl_loss_coef": "algorithm.klCoef",
    f"{A}.actor.clip_ratio": "algorithm.clipLow and clipHigh",
    f"{A}.actor.ppo_micro_batch_size_per_gpu": "training.microbatchSize (prompts: samples / rollout.n)",
    f"{A}.model.lora_rank": "model.lora.rank (0: no LoRA)",
    f"{A}.rollout.tensor_model_parallel_size": "roles.rollout.resources.gpus",
    "data.train_files": "data.train",
    "data.val_files": "data.eval",
    "trainer.n_gpus_per_node": "roles (learner and rollout GPUs)",
    "trainer.nnodes": "roles (learner and rollout GPUs)",
    "trainer.logger": "training.logging",
    "trainer.experiment_name": "metadata.name and training.tracking.runName",
    "custom_reward_function.path": "data.rewardType (module:function)",
    "custom_reward_function.name": "data.rewardType (module:function)",
    f"{A}.rollout.name": "roles.rollout.backend (vllm, hf; sglang runs as vllm)",
    f"{A}.actor.use_dynamic_bsz": "training.microbatchTokens (with ppo_max_token_len_per_gpu)",
    f"{A}.actor.ppo_max_token_len_per_gpu": "training.microbatchTokens (with use_dynamic_bsz)",
    f"{A}.actor.policy_loss.loss_mode": "algorithm.policyLoss (vanilla, gspo, cispo)",
    f"{OB}.enable": "algorithm.overlong.enabled",
    f"{OB}.len": "algorithm.overlong.cacheLength",
    f"{OB}.penalty_factor": "algorithm.overlong.penaltyFactor",
    f"{RC}.rollout_is": "algorithm.rolloutCorrection.importanceSampling (token, sequence)",
    f"{RC}.rollout_is_threshold": "algorithm.rolloutCorrection.cap",
    f"{RC}.bypass_mode": "algorithm.rolloutCorrection.enabled (bypass: the ratio is against the rollout)",
}
"""Fields read by the converter's own code below (several fields make one setting)."""

DROPPED = {
    "data.filter_overlong_prompts": "prompts over data.maxPromptTokens are always dropped, with a warning",
    "data.truncation": "dverl never truncates a prompt; one longer than maxPromptTokens is dropped",
    "data.val_batch_size": "evaluation batches are sized by the rollout workers",
    "data.prompt_key": "dverl reads veRL parquet's `prompt` column itself (data.format)",
    "data.reward_fn_key": "the reward comes from data.rewardType",
    "data.return_raw_chat": "prompts are rendered with the model's chat template",
    "data.shuffle": "dverl's sampler always shuffles, seeded by training.seed",
    f"{A}.model.use_remove_padding": "dverl packs micro-batches itself (training.microbatchTokens)",
    f"{A}.model.use_shm": "no dverl equivalent (models load from model.path)",
    f"{A}.actor.fsdp_config.optimizer_offload": "cpuOffload moves parameters, gradients, optimizer",
    f"{A}.actor.strategy": "the learner's sharding is roles.learner.sharding (set from the GPU count)",
    f"{A}.actor.ulysses_sequence_parallel_size": "dverl has no sequence parallelism",
    f"{A}.rollout.gpu_memory_utilization": "dverl plan sizes vLLM's memory share itself",
    f"{A}.rollout.log_prob_micro_batch_size_per_gpu": "the log-prob pass uses the learner's micro-batch",
    f"{A}.rollout.enable_chunked_prefill": "vLLM's default is kept",
    f"{A}.rollout.enforce_eager": "vLLM's default is kept",
    f"{A}.rollout.free_cache_engine": "rollout workers keep their own GPUs (no sleep/wake between phases)",
    f"{A}.rollout.mode": "dverl's rollout workers are always asynchronous servers",
    f"{A}.ref.log_prob_micro_batch_size_per_gpu": "the reference worker sizes its own batches",
    f"{A}.ref.fsdp_config.param_offload": "a reference worker holds its model on its own GPU",
    f"{A}.hybrid_engine": "rollout workers have GPUs of their own (no hybrid engine)",
    "trainer.critic_warmup": "the critic trains from the first step",
    **{
        f"{A}.rollout.val_kwargs.{k}": "dverl evaluates with one greedy answer per prompt"
        for k in ("top_k", "top_p", "temperature", "n", "do_sample")
    },
    "reward_model.enable": "a reward model is data.rewardType reward_model with roles.reward",
    "trainer.val_before_train": "dverl always evaluates before training when data.eval is set",
    "trainer.log_val_generations": "samples are logged every training.tracking.samplesEvery steps",
    "trainer.resume_mode": "use `dverl run --resume` or the operator's automatic resume",
    "trainer.device": "the device follows roles.*.resources.gpus",
}

RETIRED = {
    f"{A}.rollout.update_weights_bucket_megabytes": "moved to rollout.checkpoint_engine in veRL 2026-01; "
    "weights travel over gRPC here",
    f"{RC}.rollout_token_veto_threshold": "removed from veRL after v0.7.0",
    f"{RC}.rollout_rs_threshold_lower": "removed from veRL after v0.7.0 (rollout_rs_threshold takes both)",
    f"{RC}.use_policy_gradient": "removed from veRL after v0.6.1 (bypass_mode with loss_type reinforce)",
    f"{A}.ref.model": "removed from veRL after v0.6.1: the reference loads actor_rollout_ref.model",
    f"{OB}.log": "a logging switch of veRL's reward manager; no dverl equivalent",
    "reward_model.reward_manager": "the reward comes from data.rewardType (the overlong buffer maps to "
    "algorithm.overlong)",
}
"""Keys of veRL's last releases that its current config no longer has."""
DROPPED.update(RETIRED)
