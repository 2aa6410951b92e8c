"""llama.cpp's command-line options, and what gguflm does with each one.

``ARG_CPP`` lists every option of llama.cpp's common parser (common/arg.cpp: llama-cli,
llama-completion, llama-server, llama-perplexity, llama-embedding, llama-tokenize), and
``LLAMA_BENCH``/``LLAMA_QUANTIZE`` those of the two tools with parsers of their own (and
``LEGACY`` a few of earlier releases); each row:
(flags, values it takes, the tools that have it, gguflm's answer). The answer ``None``: a
gguflm command standing in for the tool implements it under the same spelling; otherwise a
key of ``REASONS``: the option is accepted, does nothing, and one ``note:`` line on stderr
says why (``add_llama_options``); or, for the options that choose the model elsewhere
(``source``: a URL, Docker Hub), refused as a usage error, since ignoring them would run
another model. ``benchmarks/check_llama_flags.py`` compares these rows
with a llama.cpp source tree; ``flag_table`` writes docs/llama-cpp-flags.md from the parsers.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from typing import Any

# gguflm command -> the llama.cpp tools it stands in for (the rows' tool names)
TOOLS_OF = {
    "run": ("completion", "cli"), "chat": ("cli",), "serve": ("server",),
    "perplexity": ("perplexity",), "embed": ("embedding",), "tokenize": ("tokenize",),
    "bench": ("bench",), "quantize": ("quantize",),
}
BINARIES = {"completion": "llama-completion", "cli": "llama-cli", "server": "llama-server",
            "perplexity": "llama-perplexity", "embedding": "llama-embedding",
            "tokenize": "llama-tokenize", "bench": "llama-bench", "quantize": "llama-quantize"}
ARG_CPP_TOOLS = ("cli", "completion", "server", "perplexity", "embedding", "tokenize")

REASONS = {
    "gpu": "ignored: gguflm runs on the CPU",
    "threads": "ignored: gguflm has one thread pool, sized by -t (no affinity, priority or "
               "polling settings)",
    "numa": "ignored: gguflm does not place memory by NUMA node",
    "mmap": "ignored: gguflm always reads the memory-mapped file",
    "download": "ignored: gguflm lists its caches with gguflm pull --list and "
                "docs/models.md",
    # choosing the model elsewhere: ignoring it would run another model, so it is refused
    "source": "refused: gguflm fetches models from Hugging Face (-hf ORG/REPO[:QUANT]), not "
              "from URLs or Docker Hub; download the .gguf file and give its path",
    "multimodal": "ignored: gguflm runs text-only models",
    "draft": "ignored: gguflm has no draft models (--lookup K drafts from the prompt instead)",
    "adapters": "ignored: gguflm loads no LoRA adapters or control vectors",
    "rope": "ignored: gguflm takes RoPE scaling from the file (change it with --override-kv)",
    "sampler": "ignored: gguflm does not have this sampler (llama.cpp's default leaves it off)",
    "log": "ignored: gguflm has no log settings (--log-disable silences its status lines)",
    "cache": "ignored: gguflm neither shifts nor saves the KV cache (generation stops when "
             "the context is full; prompt prefixes are reused in memory)",
    "preset": "ignored: llama.cpp's presets download models",
    "reasoning": "ignored: gguflm always reads replies in the model's chat format "
                 "(docs/reasoning.md)",
    "interactive": "ignored: not in gguflm (gguflm chat is the interactive mode)",
    "jinja": "ignored: gguflm always renders chat templates with Jinja (sandboxed)",
    "always": "ignored: always on in gguflm serve",
    "imatrix": "ignored: gguflm quantizes without an importance matrix",
    "unsupported": "ignored: not implemented in gguflm",
}

# flags, values, tools ('*': all of llama.cpp's common parser), answer
ARG_CPP = (
    ('-h --help --usage', 0, '*', None),
    ('--version', 0, '*', None),
    ('-cl --cache-list', 0, '*', 'download'),
    ('--completion-bash', 0, '*', 'log'),
    ('--server-base', 1, 'cli', 'interactive'),
    ('--verbose-prompt', 0, 'cli completion embedding', None),
    ('--display-prompt', 0, 'cli completion', None),
    ('--no-display-prompt', 0, 'cli completion', None),
    ('-co --color', 1, 'cli completion', None),
    ('-t --threads', 1, '*', None),
    ('-tb --threads-batch', 1, '*', 'threads'),
    ('-C --cpu-mask', 1, '*', 'threads'),
    ('-Cr --cpu-range', 1, '*', 'threads'),
    ('--cpu-strict', 1, '*', 'threads'),
    ('--prio', 1, '*', 'threads'),
    ('--poll', 1, '*', 'threads'),
    ('-Cb --cpu-mask-batch', 1, '*', 'threads'),
    ('-Crb --cpu-range-batch', 1, '*', 'threads'),
    ('--cpu-strict-batch', 1, '*', 'threads'),
    ('--prio-batch', 1, '*', 'threads'),
    ('--poll-batch', 1, '*', 'threads'),
    ('-lcs --lookup-cache-static', 1, 'server', 'draft'),
    ('-lcd --lookup-cache-dynamic', 1, 'server', 'draft'),
    ('-c --ctx-size', 1, '*', None),
    ('--kv-unified-per-slot', 1, 'server', 'cache'),
    ('-n --predict --n-predict', 1, '*', None),
    ('-b --batch-size', 1, '*', None),
    ('-ub --ubatch-size', 1, '*', None),
    ('--keep', 1, '*', None),
    ('--swa-full', 0, '*', 'cache'),
    ('-ctxcp --ctx-checkpoints --swa-checkpoints', 1, 'cli server', 'cache'),
    ('-cms --checkpoint-min-step', 1, 'server', 'cache'),
    ('-cram --cache-ram', 1, 'cli server', 'cache'),
    ('-kvu --kv-unified', 0, 'perplexity server', 'cache'),
    ('-no-kvu --no-kv-unified', 0, 'perplexity server', 'cache'),
    ('--cache-idle-slots', 0, 'server', 'cache'),
    ('--no-cache-idle-slots', 0, 'server', 'cache'),
    ('--context-shift', 0, 'cli completion perplexity server', 'cache'),
    ('--no-context-shift', 0, 'cli completion perplexity server', 'cache'),
    ('--chunks', 1, 'perplexity', None),
    ('-fa --flash-attn', 1, '*', 'gpu'),
    ('-p --prompt', 1, 'cli completion embedding perplexity tokenize', None),
    ('-sys --system-prompt', 1, 'cli completion', None),
    ('--perf', 0, '*', None),
    ('--no-perf', 0, '*', None),
    ('--show-timings', 0, 'cli', None),
    ('--no-show-timings', 0, 'cli', None),
    ('-f --file', 1, 'cli completion embedding perplexity tokenize', None),
    ('-sysf --system-prompt-file', 1, 'cli completion', None),
    ('-bf --binary-file', 1, 'cli completion embedding perplexity tokenize', 'interactive'),
    ('-e --escape', 0, '*', None),
    ('--no-escape', 0, '*', None),
    ('-ptc --print-token-count', 1, 'completion', 'interactive'),
    ('--prompt-cache', 1, 'completion', 'cache'),
    ('--prompt-cache-all', 0, 'completion', 'cache'),
    ('--prompt-cache-ro', 0, 'completion', 'cache'),
    ('-r --reverse-prompt', 1, 'cli completion server', None),
    ('-sp --special', 0, 'cli completion server', None),
    ('-cnv --conversation', 0, 'completion', None),
    ('-no-cnv --no-conversation', 0, 'completion', None),
    ('-st --single-turn', 0, 'cli completion', None),
    ('-i --interactive', 0, 'completion', None),
    ('-if --interactive-first', 0, 'completion', 'interactive'),
    ('-mli --multiline-input', 0, 'cli completion', 'interactive'),
    ('--in-prefix-bos', 0, 'completion', 'interactive'),
    ('--in-prefix', 1, 'completion', 'interactive'),
    ('--in-suffix', 1, 'completion', 'interactive'),
    ('--warmup', 0, 'cli completion embedding perplexity server', None),
    ('--no-warmup', 0, 'cli completion embedding perplexity server', None),
    ('--spm-infill', 0, 'server', 'interactive'),
    ('--samplers', 1, '*', None),
    ('-s --seed', 1, '*', None),
    ('--sampler-seq --sampling-seq', 1, '*', None),
    ('--ignore-eos', 0, '*', 'unsupported'),
    ('--temp --temperature', 1, '*', None),
    ('--top-k', 1, '*', None),
    ('--top-p', 1, '*', None),
    ('--min-p', 1, '*', None),
    ('--top-nsigma --top-n-sigma', 1, '*', 'sampler'),
    ('--xtc-probability', 1, '*', 'sampler'),
    ('--xtc-threshold', 1, '*', 'sampler'),
    ('--typical --typical-p', 1, '*', None),
    ('--repeat-last-n', 1, '*', None),
    ('--repeat-penalty', 1, '*', None),
    ('--presence-penalty', 1, '*', None),
    ('--frequency-penalty', 1, '*', None),
    ('--dry-multiplier', 1, '*', 'sampler'),
    ('--dry-base', 1, '*', 'sampler'),
    ('--dry-allowed-length', 1, '*', 'sampler'),
    ('--dry-penalty-last-n', 1, '*', 'sampler'),
    ('--dry-sequence-breaker', 1, '*', 'sampler'),
    ('--adaptive-target', 1, '*', 'sampler'),
    ('--adaptive-decay', 1, '*', 'sampler'),
    ('--dynatemp-range', 1, '*', 'sampler'),
    ('--dynatemp-exp', 1, '*', 'sampler'),
    ('--mirostat', 1, '*', None),
    ('--mirostat-lr', 1, '*', None),
    ('--mirostat-ent', 1, '*', None),
    ('-l --logit-bias', 1, '*', 'sampler'),
    ('--grammar', 1, '*', None),
    ('--grammar-file', 1, '*', None),
    ('-j --json-schema', 1, '*', None),
    ('-jf --json-schema-file', 1, '*', None),
    ('-bs --backend-sampling', 0, '*', 'gpu'),
    ('--pooling', 1, 'embedding server', None),
    ('--attention', 1, 'embedding', 'unsupported'),
    ('--rope-scaling', 1, '*', 'rope'),
    ('--rope-scale', 1, '*', 'rope'),
    ('--rope-freq-base', 1, '*', 'rope'),
    ('--rope-freq-scale', 1, '*', 'rope'),
    ('--yarn-orig-ctx', 1, '*', 'rope'),
    ('--yarn-ext-factor', 1, '*', 'rope'),
    ('--yarn-attn-factor', 1, '*', 'rope'),
    ('--yarn-beta-slow', 1, '*', 'rope'),
    ('--yarn-beta-fast', 1, '*', 'rope'),
    ('-gan --grp-attn-n', 1, 'completion', 'interactive'),
    ('-gaw --grp-attn-w', 1, 'completion', 'interactive'),
    ('-kvo --kv-offload', 0, '*', 'gpu'),
    ('-nkvo --no-kv-offload', 0, '*', 'gpu'),
    ('--repack', 0, '*', 'gpu'),
    ('-nr --no-repack', 0, '*', 'gpu'),
    ('--no-host', 0, '*', 'gpu'),
    ('-ctk --cache-type-k', 1, '*', None),
    ('-ctv --cache-type-v', 1, '*', None),
    ('--hellaswag', 0, 'perplexity', 'unsupported'),
    ('--hellaswag-tasks', 1, 'perplexity', 'unsupported'),
    ('--winogrande', 0, 'perplexity', 'unsupported'),
    ('--winogrande-tasks', 1, 'perplexity', 'unsupported'),
    ('--multiple-choice', 0, 'perplexity', 'unsupported'),
    ('--multiple-choice-tasks', 1, 'perplexity', 'unsupported'),
    ('--kl-divergence', 0, 'perplexity', 'unsupported'),
    ('--save-all-logits --kl-divergence-base', 1, 'perplexity', 'unsupported'),
    ('--ppl-stride', 1, 'perplexity', 'unsupported'),
    ('--ppl-output-type', 1, 'perplexity', 'unsupported'),
    ('-dt --defrag-thold', 1, '*', 'cache'),
    ('-np --parallel', 1, '*', None),
    ('-cb --cont-batching', 0, 'server', 'always'),
    ('-nocb --no-cont-batching', 0, 'server', 'unsupported'),
    ('-mm --mmproj', 1, '*', 'multimodal'),
    ('-mmu --mmproj-url', 1, '*', 'multimodal'),
    ('--mmproj-auto', 0, 'cli server', 'multimodal'),
    ('--no-mmproj --no-mmproj-auto', 0, 'cli server', 'multimodal'),
    ('--mmproj-offload', 0, '*', 'gpu'),
    ('--no-mmproj-offload', 0, '*', 'gpu'),
    ('-mmdev --mmproj-device', 1, '*', 'gpu'),
    ('--image --audio --video', 1, 'cli', 'multimodal'),
    ('--image-min-tokens', 1, '*', 'multimodal'),
    ('--image-max-tokens', 1, '*', 'multimodal'),
    ('--mtmd-batch-max-tokens', 1, 'server', 'multimodal'),
    ('--video-fps', 1, '*', 'multimodal'),
    ('--video-timestamp-interval', 1, '*', 'multimodal'),
    ('--video-ffmpeg-dir', 1, '*', 'multimodal'),
    ('--rpc', 1, '*', 'gpu'),
    ('-lm --load-mode', 1, '*', 'mmap'),
    ('-lzm --lazy-mode', 1, '*', 'mmap'),
    ('--numa', 1, '*', 'numa'),
    ('-dev --device', 1, '*', 'gpu'),
    ('--list-devices', 0, '*', 'gpu'),
    ('-ot --override-tensor', 1, '*', 'gpu'),
    ('-cmoe --cpu-moe', 0, '*', 'gpu'),
    ('-ncmoe --n-cpu-moe', 1, '*', 'gpu'),
    ('-ncffn --n-cpu-ffn', 1, '*', 'gpu'),
    ('-ngl --gpu-layers --n-gpu-layers', 1, '*', 'gpu'),
    ('-sm --split-mode', 1, '*', 'gpu'),
    ('-ts --tensor-split', 1, '*', 'gpu'),
    ('-mg --main-gpu', 1, '*', 'gpu'),
    ('-fit --fit', 1, '*', 'gpu'),
    ('-fitt --fit-target', 1, '*', 'gpu'),
    ('-fitc --fit-ctx', 1, '*', 'gpu'),
    ('--check-tensors', 0, '*', 'mmap'),
    ('--override-kv', 1, '*', None),
    ('--op-offload', 0, '*', 'gpu'),
    ('--no-op-offload', 0, '*', 'gpu'),
    ('--lora', 1, '*', 'adapters'),
    ('--lora-scaled', 1, '*', 'adapters'),
    ('--control-vector', 1, '*', 'adapters'),
    ('--control-vector-scaled', 1, '*', 'adapters'),
    ('--control-vector-layer-range', 2, '*', 'adapters'),
    ('-a --alias', 1, 'server', None),
    ('--tags', 1, 'server', 'unsupported'),
    ('-m --model', 1, '*', None),
    ('-mu --model-url', 1, '*', 'source'),
    ('-dr --docker-repo', 1, '*', 'source'),
    ('-hf -hfr --hf-repo', 1, '*', None),
    ('-hff --hf-file', 1, '*', None),
    ('-hft --hf-token', 1, '*', None),
    ('-o --output --output-file', 1, 'cli', 'unsupported'),
    ('--ids', 0, 'tokenize', None),
    ('--stdin', 0, 'tokenize', None),
    ('--no-bos', 0, 'tokenize', None),
    ('--no-parse-special', 0, 'tokenize', None),
    ('--show-count', 0, 'tokenize', None),
    ('--embd-normalize', 1, 'embedding server', None),
    ('--embd-output-format', 1, 'embedding', 'unsupported'),
    ('--embd-separator', 1, 'embedding', None),
    ('--cls-separator', 1, 'embedding', 'unsupported'),
    ('--host', 1, 'server', None),
    ('--port', 1, 'server', None),
    ('--reuse-port', 0, 'server', 'unsupported'),
    ('--path', 1, 'server', 'unsupported'),
    ('--cors-origins', 1, 'server', None),
    ('--cors-methods', 1, 'server', 'unsupported'),
    ('--cors-headers', 1, 'server', 'unsupported'),
    ('--cors-credentials', 0, 'server', 'unsupported'),
    ('--no-cors-credentials', 0, 'server', 'unsupported'),
    ('--api-prefix', 1, 'server', 'unsupported'),
    ('--ui-config --webui-config', 1, 'server', 'unsupported'),
    ('--ui-config-file --webui-config-file', 1, 'server', 'unsupported'),
    ('--ui-mcp-proxy --webui-mcp-proxy', 0, 'server', 'unsupported'),
    ('--no-ui-mcp-proxy --no-webui-mcp-proxy', 0, 'server', 'unsupported'),
    ('--tools', 1, 'server', 'unsupported'),
    ('--tools-runtime', 1, 'server', 'unsupported'),
    ('--mcp-servers-config', 1, 'server', 'unsupported'),
    ('--mcp-servers-json', 1, 'server', 'unsupported'),
    ('-ag --agent', 0, 'server', 'unsupported'),
    ('-no-ag --no-agent', 0, 'server', 'unsupported'),
    ('--ui --webui', 0, 'server', None),
    ('--no-ui --no-webui', 0, 'server', None),
    ('--embedding --embeddings', 0, 'server', 'always'),
    ('--rerank --reranking', 0, 'server', 'unsupported'),
    ('--api-key', 1, 'server', None),
    ('--api-key-file', 1, 'server', 'unsupported'),
    ('--ssl-key-file', 1, 'server', 'unsupported'),
    ('--ssl-cert-file', 1, 'server', 'unsupported'),
    ('--chat-template-kwargs', 1, 'cli server', None),
    ('-to --timeout', 1, 'server', 'unsupported'),
    ('--sse-ping-interval', 1, 'server', 'unsupported'),
    ('--threads-http', 1, 'server', 'unsupported'),
    ('--cache-prompt', 0, 'server', 'always'),
    ('--no-cache-prompt', 0, 'server', 'unsupported'),
    ('--cache-reuse', 1, 'server', 'cache'),
    ('--metrics', 0, 'server', 'always'),
    ('--props', 0, 'server', 'unsupported'),
    ('--slots', 0, 'server', 'always'),
    ('--no-slots', 0, 'server', 'unsupported'),
    ('--slot-save-path', 1, 'server', 'cache'),
    ('--media-path', 1, 'server', 'multimodal'),
    ('--models-dir', 1, 'server', 'unsupported'),
    ('--models-preset', 1, 'server', 'unsupported'),
    ('--models-max', 1, 'server', 'unsupported'),
    ('--models-autoload', 0, 'server', 'unsupported'),
    ('--no-models-autoload', 0, 'server', 'unsupported'),
    ('--jinja', 0, 'cli completion server', None),
    ('--no-jinja', 0, 'cli completion server', 'jinja'),
    ('--reasoning-format', 1, 'cli completion server', None),
    ('-rea --reasoning', 1, 'cli completion server', None),
    ('--reasoning-effort', 1, 'cli completion server', None),
    ('--reasoning-budget', 1, 'cli completion server', None),
    ('--reasoning-budget-message', 1, 'cli completion server', None),
    ('--reasoning-preserve', 0, 'cli completion server', None),
    ('--no-reasoning-preserve', 0, 'cli completion server', None),
    ('--chat-template', 1, 'cli completion server', None),
    ('--chat-template-file', 1, 'cli completion server', None),
    ('--skip-chat-parsing', 0, 'cli completion server', 'reasoning'),
    ('--no-skip-chat-parsing', 0, 'cli completion server', 'reasoning'),
    ('--prefill-assistant', 0, 'server', 'unsupported'),
    ('--no-prefill-assistant', 0, 'server', 'unsupported'),
    ('-sps --slot-prompt-similarity', 1, 'server', 'cache'),
    ('--lora-init-without-apply', 0, 'server', 'adapters'),
    ('--sleep-idle-seconds', 1, 'server', 'unsupported'),
    ('--simple-io', 0, 'cli completion', 'log'),
    ('--log-disable', 0, '*', None),
    ('--log-file', 1, '*', 'log'),
    ('--log-jsonl', 0, '*', 'log'),
    ('--no-log-jsonl', 0, '*', 'unsupported'),
    ('--log-prompts-dir', 1, 'cli server', 'log'),
    ('--log-colors', 1, '*', 'log'),
    ('-v --verbose --log-verbose', 0, '*', None),
    ('--offline', 0, '*', None),
    ('-lv --verbosity --log-verbosity', 1, '*', 'log'),
    ('--log-prefix', 0, '*', 'log'),
    ('--no-log-prefix', 0, '*', 'unsupported'),
    ('--log-timestamps', 0, '*', 'log'),
    ('--no-log-timestamps', 0, '*', 'unsupported'),
    ('--spec-draft-hf -hfd -hfrd --hf-repo-draft', 1, 'cli server', 'draft'),
    ('--spec-draft-threads -td --threads-draft', 1, 'cli server', 'draft'),
    ('--spec-draft-threads-batch -tbd --threads-batch-draft', 1, 'cli server', 'draft'),
    ('--spec-draft-cpu-mask -Cd --cpu-mask-draft', 1, 'cli server', 'draft'),
    ('--spec-draft-cpu-range -Crd --cpu-range-draft', 1, 'cli server', 'draft'),
    ('--spec-draft-cpu-strict --cpu-strict-draft', 1, 'cli server', 'draft'),
    ('--spec-draft-prio --prio-draft', 1, 'cli server', 'draft'),
    ('--spec-draft-poll --poll-draft', 1, 'cli server', 'draft'),
    ('--spec-draft-cpu-mask-batch -Cbd --cpu-mask-batch-draft', 1, 'cli server', 'draft'),
    ('--spec-draft-cpu-strict-batch --cpu-strict-batch-draft', 1, 'cli server', 'draft'),
    ('--spec-draft-prio-batch --prio-batch-draft', 1, 'cli server', 'draft'),
    ('--spec-draft-poll-batch --poll-batch-draft', 1, 'cli server', 'draft'),
    ('--spec-draft-type-k -ctkd --cache-type-k-draft', 1, '*', 'draft'),
    ('--spec-draft-type-v -ctvd --cache-type-v-draft', 1, '*', 'draft'),
    ('--spec-draft-override-tensor -otd --override-tensor-draft', 1, 'cli server', 'draft'),
    ('--spec-draft-cpu-moe -cmoed --cpu-moe-draft', 0, 'cli server', 'draft'),
    ('--spec-draft-n-cpu-moe --spec-draft-ncmoe -ncmoed --n-cpu-moe-draft', 1, 'cli server',
     'draft'),
    ('--spec-draft-n-max', 1, 'cli server', 'draft'),
    ('--spec-draft-n-min', 1, 'cli server', 'draft'),
    ('--spec-synth-len', 1, 'cli server', 'draft'),
    ('--spec-synth-rates', 1, 'cli server', 'draft'),
    ('--spec-draft-p-split --draft-p-split', 1, 'cli server', 'draft'),
    ('--spec-draft-p-min --draft-p-min', 1, 'cli server', 'draft'),
    ('--spec-draft-backend-sampling', 0, 'cli server', 'draft'),
    ('--no-spec-draft-backend-sampling', 0, 'cli server', 'unsupported'),
    ('--spec-draft-device -devd --device-draft', 1, 'cli server', 'draft'),
    ('--spec-draft-ngl -ngld --gpu-layers-draft --n-gpu-layers-draft', 1, 'cli server', 'draft'),
    ('--spec-draft-model -md --model-draft', 1, 'cli server', 'draft'),
    ('--spec-type', 1, 'cli server', 'draft'),
    ('--spec-ngram-mod-n-min', 1, 'cli server', 'draft'),
    ('--spec-ngram-mod-n-max', 1, 'cli server', 'draft'),
    ('--spec-ngram-mod-n-match', 1, 'cli server', 'draft'),
    ('--spec-ngram-simple-size-n', 1, 'cli server', 'draft'),
    ('--spec-ngram-simple-size-m', 1, 'cli server', 'draft'),
    ('--spec-ngram-simple-min-hits', 1, 'cli server', 'draft'),
    ('--spec-ngram-map-k-size-n', 1, 'cli server', 'draft'),
    ('--spec-ngram-map-k-size-m', 1, 'cli server', 'draft'),
    ('--spec-ngram-map-k-min-hits', 1, 'cli server', 'draft'),
    ('--spec-ngram-map-k4v-size-n', 1, 'cli server', 'draft'),
    ('--spec-ngram-map-k4v-size-m', 1, 'cli server', 'draft'),
    ('--spec-ngram-map-k4v-min-hits', 1, 'cli server', 'draft'),
    ('--draft --draft-n --draft-max', 1, 'cli server', 'draft'),
    ('--draft-min --draft-n-min', 1, 'cli server', 'draft'),
    ('--spec-ngram-size-n', 1, 'server', 'draft'),
    ('--spec-ngram-size-m', 1, 'server', 'draft'),
    ('--spec-ngram-min-hits', 1, 'server', 'draft'),
    ('--embd-gemma-default', 0, 'embedding server', 'preset'),
    ('--fim-qwen-1.5b-default', 0, 'server', 'preset'),
    ('--fim-qwen-3b-default', 0, 'server', 'preset'),
    ('--fim-qwen-7b-default', 0, 'server', 'preset'),
    ('--fim-qwen-7b-spec', 0, 'server', 'preset'),
    ('--fim-qwen-14b-spec', 0, 'server', 'preset'),
    ('--fim-qwen-30b-default', 0, 'server', 'preset'),
    ('--gpt-oss-20b-default', 0, 'cli server', 'preset'),
    ('--gpt-oss-120b-default', 0, 'cli server', 'preset'),
    ('--vision-gemma-4b-default', 0, 'cli server', 'preset'),
    ('--vision-gemma-12b-default', 0, 'cli server', 'preset'),
    ('--spec-default', 0, 'cli server', 'draft'),
)
# options of earlier llama.cpp releases that command lines still carry (this arg.cpp has
# --load-mode instead)
LEGACY = (
    ('--mlock', 0, '*', 'mmap'),
    ('--mmap', 0, '*', 'mmap'),
    ('--no-mmap', 0, '*', 'mmap'),
)
LLAMA_BENCH = (
    ('-h --help', 0, None),
    ('--version', 0, None),
    ('--numa', 1, 'numa'),
    ('-r --repetitions', 1, None),
    ('--prio', 1, 'threads'),
    ('--delay', 1, 'unsupported'),
    ('-o --output', 1, 'unsupported'),
    ('-oe --output-err', 1, 'unsupported'),
    ('--list-devices', 0, 'gpu'),
    ('-v --verbose', 0, 'unsupported'),
    ('--progress', 0, 'unsupported'),
    ('--no-warmup', 0, None),
    ('-fitt --fit-target', 1, 'gpu'),
    ('-fitc --fit-ctx', 1, 'gpu'),
    ('-rpc --rpc', 1, 'gpu'),
    ('-m --model', 1, None),
    ('-hf -hfr --hf-repo', 1, None),
    ('-hff --hf-file', 1, None),
    ('-hft --hf-token', 1, None),
    ('--offline', 0, None),
    ('-p --n-prompt', 1, None),
    ('-n --n-gen', 1, None),
    ('-pg', 1, 'unsupported'),
    ('-d --n-depth', 1, 'unsupported'),
    ('-b --batch-size', 1, None),
    ('-ub --ubatch-size', 1, None),
    ('-ctk --cache-type-k', 1, None),
    ('-ctv --cache-type-v', 1, None),
    ('-t --threads', 1, None),
    ('-C --cpu-mask', 1, 'threads'),
    ('--cpu-strict', 1, 'threads'),
    ('--poll', 1, 'threads'),
    ('-ngl --n-gpu-layers', 1, 'gpu'),
    ('-ncmoe --n-cpu-moe', 1, 'gpu'),
    ('-sm --split-mode', 1, 'gpu'),
    ('-mg --main-gpu', 1, 'gpu'),
    ('-nkvo --no-kv-offload', 1, 'gpu'),
    ('-fa --flash-attn', 1, 'gpu'),
    ('-dev --device', 1, 'gpu'),
    ('-lm --load-mode', 1, 'mmap'),
    ('-lzm --lazy-mode', 1, 'mmap'),
    ('-embd --embeddings', 1, 'unsupported'),
    ('-ts --tensor-split', 1, 'gpu'),
    ('-ot --override-tensor', 1, 'gpu'),
    ('-nopo --no-op-offload', 1, 'gpu'),
    ('--no-host', 1, 'gpu'),
    ('--repack', 1, 'gpu'),
)
LLAMA_QUANTIZE = (
    ('-h --help', 0, None),
    ('--allow-requantize', 0, None),
    ('--leave-output-tensor', 0, None),
    ('--pure', 0, None),
    ('--imatrix', 1, 'imatrix'),
    ('--include-weights', 1, 'imatrix'),
    ('--exclude-weights', 1, 'imatrix'),
    ('--output-tensor-type', 1, None),
    ('--token-embedding-type', 1, None),
    ('--tensor-type', 1, 'unsupported'),
    ('--tensor-type-file', 1, 'unsupported'),
    ('--prune-layers', 1, 'unsupported'),
    ('--keep-split', 0, 'unsupported'),
    ('--override-kv', 1, 'unsupported'),
    ('--dry-run', 0, 'unsupported'),
    ('--max-buffer-size', 1, 'unsupported'),
)


def rows_for(command: str) -> Iterator[tuple[str, int, str]]:
    """(flags, values, answer key or None) of every llama.cpp option of ``command``'s
    tools, each once."""
    tools = set(TOOLS_OF[command])
    seen: set[str] = set()
    for table, default in ((ARG_CPP, None), (LEGACY, None), (LLAMA_BENCH, "bench"),
                           (LLAMA_QUANTIZE, "quantize")):
        for row in table:
            flags, nargs, where, reason = row if default is None else (*row[:2], default, row[2])
            if where != "*" and not tools & set(where.split()):
                continue
            if where == "*" and not tools & set(ARG_CPP_TOOLS):
                continue
            if flags not in seen:
                seen.add(flags)
                yield flags, nargs, reason


def fallback_reason(command: str) -> str:
    """Why an option gguflm has elsewhere means nothing to ``command``."""
    return f"ignored: does not apply to gguflm {command}"


class Ignored(argparse.Action):
    """A llama.cpp option that means nothing here: accepted, remembered with its reason
    (``ignored_options``), noted once after parsing."""

    def __init__(self, *args: Any, reason: str = "", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.reason = reason

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        if self.reason.startswith("refused:"):
            parser.error(f"{option_string}: {self.reason}")
        seen = list(getattr(namespace, "ignored_options", None) or [])
        shown = option_string if not values else f"{option_string} {' '.join(values)}"
        seen.append((shown, self.reason))
        namespace.ignored_options = seen


def add_llama_options(p: argparse.ArgumentParser, command: str) -> None:
    """Every llama.cpp option of ``command``'s tools that ``p`` lacks, accepted as Ignored
    (hidden from --help, which points at the table instead)."""
    g = p.add_argument_group(
        "llama.cpp's other options",
        f"{', '.join(BINARIES[t] for t in TOOLS_OF[command])}'s other options are accepted; "
        "one note: line says why each does nothing here (docs/llama-cpp-flags.md)")
    from .. import __version__

    for flags, nargs, reason in rows_for(command):
        missing = [f for f in flags.split() if f not in p._option_string_actions]
        if not missing:
            continue
        if missing[0] == "--usage":  # llama.cpp's third spelling of --help
            p.add_argument("--usage", action="help", help=argparse.SUPPRESS)
            continue
        if missing[0] == "--version":
            p.add_argument("--version", action="version", version=f"gguflm {__version__}",
                           help="print gguflm's version and exit")
            continue
        text = REASONS[reason] if reason is not None else fallback_reason(command)
        g.add_argument(*missing, action=Ignored, nargs=nargs, reason=text,
                       dest="ignored_options", default=None, help=argparse.SUPPRESS)


def notes(ignored: list[tuple[str, str]]) -> list[str]:
    """One ``note:`` line per reason, naming the options it covers."""
    by_reason: dict[str, list[str]] = {}
    for shown, reason in ignored:
        by_reason.setdefault(reason, []).append(shown)
    return [f"note: {', '.join(opts)}: {reason}" for reason, opts in by_reason.items()]


def flag_table(parsers: dict[str, argparse.ArgumentParser]) -> str:
    """docs/llama-cpp-flags.md: for each gguflm command, every llama.cpp option of its tools
    and what gguflm does with it, read from ``parsers`` (gguflm's subcommand parsers)."""
    out = ["# llama.cpp's options in gguflm", "",
           "Generated from gguflm's parsers (`python -m gguflm.cli.llama_options`); "
           "tests/cli/test_llama_options.py checks that it is current. *works*: the option does "
           "what llama.cpp's does (the text is gguflm's help); *ignored*: it is accepted and "
           "one `note:` line on stderr says why it does nothing here.", ""]
    for command in TOOLS_OF:
        p = parsers[command]
        tools = " / ".join(f"`{BINARIES[t]}`" for t in TOOLS_OF[command])
        out += [f"## gguflm {command} ({tools})", "", "| llama.cpp option | gguflm |",
                "|---|---|"]
        for flags, _nargs, _reason in rows_for(command):
            out.append(f"| `{flags}` | {_answer(p, flags.split())} |")
        out.append("")
    return "\n".join(out)


def _answer(p: argparse.ArgumentParser, flags: list[str]) -> str:
    """What ``flags`` (one llama.cpp option's spellings) do in ``p``; spellings that do
    different things are named."""
    by_action: dict[int, tuple[list[str], str]] = {}
    for flag in flags:
        action = p._option_string_actions.get(flag)
        if action is None:
            text = "**missing**"
        elif isinstance(action, Ignored):
            text = action.reason
        else:
            text = "works: " + _help(action)
        by_action.setdefault(id(action), ([], text))[0].append(flag)
    if len(by_action) == 1:
        return next(iter(by_action.values()))[1]
    return "; ".join(f"{' '.join(f'`{f}`' for f in fl)} {text}" for fl, text in by_action.values())


def _help(action: argparse.Action) -> str:
    text = action.help if action.help not in (None, argparse.SUPPRESS) else ""
    if "%(default)" in text:
        text = text % {"default": action.default}
    return " ".join(text.split()).replace("|", "\\|") or "as llama.cpp's"


if __name__ == "__main__":
    from gguflm.cli import build_parser
    from gguflm.cli.llama_options import flag_table  # not __main__'s copy of this module

    print(flag_table(build_parser().parse_args(["run"]).subparsers), end="")
