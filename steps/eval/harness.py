"""An lm-eval-harness model over our checkpoints: `HarnessLM` implements `lm_eval.api.model.LM`.

Imported only when an eval step asks for harness tasks (it imports lm_eval and torch).

- `loglikelihood`: log P(continuation | context), and whether greedy decoding would produce the
  continuation. Context and continuation are encoded separately (a space that ends the context
  moves to the continuation, as the harness's own models do), joined, and cut from the left to
  the model's context + 1 tokens.
- `loglikelihood_rolling`: the log-likelihood of a whole text, in the harness's own disjoint
  windows of the model's context (lm_eval.utils.get_rolling_token_windows, as its `hf` model
  uses them); the first window is conditioned on the end-of-text token.
- `generate_until`: greedy decoding (no sampling), a full forward per token (the tiny models
  this serves need no KV cache), stopped at any `until` string or `max_gen_toks`.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from lm_eval.api.model import LM



class HarnessLM(LM):
    def __init__(self, model: Any, tokenizer: Any, device: torch.device, max_length: int, eot_id: int,
                 batch_size: int = 16, max_gen_tokens: int = 32) -> None:
        super().__init__()
        self.model, self.tok, self.dev = model, tokenizer, device
        self.max_length, self.eot_id, self.batch, self.max_gen = max_length, eot_id, batch_size, max_gen_tokens

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids if text else []

    @torch.no_grad()
    def _logprobs(self, rows: list[list[int]]) -> list[torch.Tensor]:
        """Log-softmax over the vocabulary at every position of each token list (inputs only)."""
        out = []
        for i in range(0, len(rows), self.batch):
            chunk = rows[i:i + self.batch]
            width = max(len(r) for r in chunk)
            x = torch.zeros(len(chunk), width, dtype=torch.long)
            for j, r in enumerate(chunk):
                x[j, :len(r)] = torch.tensor(r)
            logits, _ = self.model(x.to(self.dev))
            logp = F.log_softmax(logits.float(), dim=-1).cpu()
            out += [logp[j, :len(r)] for j, r in enumerate(chunk)]
        return out

    def _score(self, pairs: list[tuple[list[int], list[int]]], prefix: bool = True) -> list[tuple[float, bool]]:
        """(sum log P(cont | ctx), greedy) for token pairs (after the end-of-text token when
        `prefix`), cut to the model's context."""
        inputs, conts = [], []
        for ctx, cont in pairs:
            ids = ([self.eot_id] * prefix + ctx + cont)[-(self.max_length + 1):]
            cont = cont[-(len(ids) - 1):]
            inputs.append(ids[:-1])
            conts.append(cont)
        results = []
        for logp, ids, cont in zip(self._logprobs(inputs), inputs, conts):
            tail = logp[len(ids) - len(cont):]
            target = torch.tensor(cont)
            score = tail.gather(-1, target[:, None]).sum().item()
            results.append((score, bool((tail.argmax(-1) == target).all())))
        return results

    def loglikelihood(self, requests: list[Any]) -> list[tuple[float, bool]]:
        pairs = []
        for req in requests:
            context, continuation = req.args[0], req.args[1]
            spaces = len(context) - len(context.rstrip(" "))
            if spaces:
                context, continuation = context[:-spaces], context[-spaces:] + continuation
            pairs.append((self.encode(context), self.encode(continuation)))
        return self._score(pairs)

    def loglikelihood_rolling(self, requests: list[Any]) -> list[float]:
        from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

        out = []
        for req in requests:  # the harness's own windows, as its hf model scores them
            windows = get_rolling_token_windows(self.encode(req.args[0]), self.eot_id, self.max_length, 1)
            pairs = [make_disjoint_window(w) for w in windows]
            out.append(sum(score for score, _ in self._score(pairs, prefix=False)) if pairs else 0.0)
        return out

    @torch.no_grad()
    def generate_until(self, requests: list[Any]) -> list[str]:
        out = []
        for req in requests:
            context, kwargs = req.args[0], dict(req.args[1] or {})
            until = kwargs.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            budget = int(kwargs.get("max_gen_toks", self.max_gen))
            ids, new = self.encode(context) or [self.eot_id], []
            text = ""
            for _ in range(budget):
                x = torch.tensor([(ids + new)[-self.max_length:]], device=self.dev)
                logits, _ = self.model(x)
                nxt = int(logits[0, -1].argmax())
                if nxt == self.eot_id:
                    break
                new.append(nxt)
                text = self.tok.decode(new)
                if any(u and u in text for u in until):
                    break
            for u in until:
                if u and u in text:
                    text = text[:text.index(u)]
            out.append(text)
        return out


def run_tasks(model: Any, tokenizer_url: str, meta: dict[str, Any], cfg: Any, device: torch.device,
              batch_size: int) -> dict[str, Any]:
    """Run the harness tasks of `cfg` (a HarnessConfig); returns the harness's per-task metrics."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    from steps.data.tokenizer import load_tokenizer

    tok = load_tokenizer(tokenizer_url)
    eot = tok.token_to_id("<|eos|>")
    eot = eot if eot is not None else 0
    lm = HarnessLM(model, tok, device, max_length=int(meta["seq_len"]) - 1, eot_id=eot, batch_size=batch_size,
                   max_gen_tokens=cfg.max_gen_tokens)
    manager = TaskManager(include_path=cfg.include_path, include_defaults=cfg.include_path is None)
    out = lm_eval.simple_evaluate(model=lm, tasks=list(cfg.tasks), num_fewshot=cfg.num_fewshot, limit=cfg.limit,
                                  task_manager=manager, log_samples=False, bootstrap_iters=0)
    return {task: {k: v for k, v in metrics.items() if isinstance(v, (int, float, str))}
            for task, metrics in (out or {}).get("results", {}).items()}
