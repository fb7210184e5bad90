"""Settings of ``agentkit rollout``; each field's description is its ``--help`` text."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class RolloutConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    env: str = Field("textworld/simple-v0", description="Environment id (see `agentkit envs list`).")
    model: str | None = Field(None, description="Model folder (Hugging Face format). Default: the tiny model, built on first use.")
    episodes: int = Field(8, gt=0, description="Number of tasks to play.")
    group_size: int = Field(1, gt=0, description="Times each task is played; the copies share a `group`.")
    out: str | None = Field(None, description="Output JSONL file. Default: runs/rollout-<time>.jsonl.")
    seed: int = Field(0, ge=0, description="First task seed (tasks are seed..seed+episodes-1); also seeds sampling.")
    split: str = Field("train", description="Which task split to play (train, eval, or an environment's own held-out split).")
    context: Literal["chat", "window"] = Field("chat", description="chat: one growing conversation (token-exact); window: fresh prompt with the last turns.")
    window: int = Field(3, ge=0, description="Turns of history in window mode.")
    max_turns: int = Field(8, gt=0, description="Episodes are truncated after this many turns.")
    temperature: float = Field(1.0, ge=0, description="Sampling temperature (0 = greedy).")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling mass.")
    top_k: int = Field(0, ge=0, description="Sample among the k most likely tokens (0 = off).")
    max_new_tokens: int = Field(32, gt=0, description="Most tokens per response.")
    max_in_flight: int = Field(0, ge=0, description="Episodes played at once (0 = all).")
    show_admissible: bool = Field(True, description="List the admissible actions in each observation.")
    env_kwargs: dict[str, str | int | float | bool] = Field(default_factory=dict, description="Keyword arguments for the environment, e.g. level=10.")
    env_workers: int = Field(2, ge=0, description="Worker processes that run the environments (0 = step them in this process).")
    step_timeout: float = Field(120.0, gt=0, description="Seconds an environment step may take before its worker is restarted and the episode ended.")
    max_env_errors: int = Field(10, ge=0, description="Stop once this many episodes in a row end in an environment error (it raised, its worker died or hung); the episodes already written stay. 0 = never stop.")
    ray: str | None = Field(None, description="Run environment workers as Ray actors on this cluster: auto (a running cluster), an address host:port or ray://..., or local (start one here). --env-workers sets the number of actors.")
    skills: str | None = Field(None, description="Skill bank (file or starter name) whose retrieved skills the policy sees (skill_grpo policies).")
    retrieval: str = Field("keyword", description="Skill retriever with --skills: ucb | keyword | full | random.")
    skills_k: int = Field(3, gt=0, description="Skills retrieved per episode with --skills.")
    device: str = Field("cpu", description="Torch device for the transformers backend.")
    backend: Literal["hf", "vllm", "openai"] = Field("hf", description="Generation backend: hf (transformers), vllm (in-process engine), openai (an OpenAI-compatible server at --base-url; --model is the folder with its tokenizer).")
    vllm_args: dict[str, Any] = Field(default_factory=dict, description='vllm.LLM settings for --backend vllm, as JSON, e.g. \'{"gpu_memory_utilization": 0.5, "dtype": "float32"}\'.')
    base_url: str | None = Field(None, description="Server API root for --backend openai, e.g. http://127.0.0.1:8000/v1 (key from $OPENAI_API_KEY).")
    served_model: str | None = Field(None, description="Model name on the server (default: the first it lists).")
    request_timeout: float = Field(120.0, gt=0, description="Seconds one request to the --backend openai server may take (each retry gets as long).")
    max_retries: int = Field(4, ge=0, description="Retries of a failed request to the --backend openai server (connection errors, timeouts, 429/5xx, malformed answers), with exponential backoff.")
    max_response_bytes: int = Field(64 * 2**20, gt=0, description="Largest answer accepted from the --backend openai server, in bytes; a bigger one is refused.")
    api: Literal["completions", "chat"] = Field("completions", description="completions: token-id prompts, token-exact (vLLM, SGLang); chat: messages (hosted APIs; re-tokenized when the server returns no ids).")
    concurrency: int = Field(16, gt=0, description="Requests in flight with --backend openai.")
    append: bool = Field(False, description="Append to an existing output file.")
    overwrite: bool = Field(False, description="Replace an existing output file (the old one stays until the new one is complete).")
    resume: bool = Field(False, description="Complete an interrupted rollout: --out is the file it was writing; episodes already there are "
                         "kept (a torn last line goes to FILE.torn), the rest are played and appended. The other flags must "
                         "match the interrupted command (checked against the file).")

    @model_validator(mode="after")
    def _check(self) -> RolloutConfig:
        if self.append and self.overwrite:
            raise ValueError("--append and --overwrite exclude each other; pick one.")
        if self.resume and self.overwrite:
            raise ValueError("--resume completes the episodes missing from --out, --overwrite replaces the file; pick one.")
        if self.resume and not self.out:
            raise ValueError("--resume needs --out FILE: the output file of the interrupted rollout.")
        if self.ray is not None and self.env_workers == 0:
            raise ValueError("--ray runs the environments in Ray actors, but --env-workers 0 means in this process; "
                             "pass --env-workers N (N actors) or drop --ray.")
        if self.backend == "openai" and not self.base_url:
            raise ValueError("--backend openai needs --base-url http://HOST:PORT/v1 (the server's API root).")
        if self.base_url and self.backend != "openai":
            raise ValueError("--base-url is for --backend openai; add --backend openai.")
        return self
