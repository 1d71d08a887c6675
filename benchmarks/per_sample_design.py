"""Members learned before their rewards: one pass each (the product) vs per-sample gradients from one padded pass.

    python -m benchmarks.per_sample_design                     # quick-grading's shape: 464-token prompt, 4 members
    python -m benchmarks.per_sample_design --threads 2 --out outputs/per_sample_design.json

Under `release="content"` / `"turn"` a member is learned when its tokens are final, before its reward: its score
gradient H_i must stay separate until the reward binds it (`streaming/release.py`), so members ready together cannot
share one backward of a weighted sum the way the last members of a group do once their advantages are fixed
(`streaming/prefix_batch.py`). The only way to batch them is per-sample parameter gradients from one padded pass.
This design benchmark measures whether that would pay, over one group's shared prefix, side by side in one process:

- `one_by_one` — each member's continuation over the prefix's detached key/values, one forward and one backward
  each, its parameter gradient flattened (what content release runs);
- `padded` — the members as one right-padded pass whose backward takes their *sum* (the weighted-sum batching of
  `prefix_batch.py`: the cost floor of any batching);
- `per_sample` — the same padded pass, but its backward asks for the gradients of every `nn.Linear` output, embedding
  output and RMSNorm weight (replaced per row by a broadcasting leaf) and of per-row prefix proxies; per-member weight
  gradients then come from `einsum('bto,bti->boi')` (Linear), per-row `index_add` (embedding, its `padding_idx` row
  left at zero) and the norm leaves' rows.

Checks that `per_sample` gives each member's gradient and boundary adjoint (relative error against `one_by_one`) and
prints the median wall time of each variant (interleaved, after a warm-up). Writes JSON. The model is a tiny Qwen3
(RMSNorm, q/k norms, tied embeddings); other module types would need their own per-sample rules.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from trl_thundersync.streaming.segment_backward import model_logits, proxy_cache
from trl_thundersync.tiny.model import build_tiny_model, build_tiny_tokenizer

VARIANTS = ("one_by_one", "padded", "per_sample")


def _log_probs(logits: torch.Tensor, tokens: list[int]) -> torch.Tensor:
    """Σ log π(tokens) of rows (len(tokens), V) predicting them."""
    return torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(tokens)[:, None]).sum()


class Group:
    """One group: a prompt forwarded once (graph retained), and member continuations over it."""

    def __init__(self, model, prompt: list[int], continuations: list[list[int]]) -> None:
        self.model, self.continuations = model, continuations
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.layers = model.config.num_hidden_layers
        cache = proxy_cache([])
        model_logits(model, prompt, torch.device("cpu"), cache, keep=1)
        self.outputs = [layer.keys for layer in cache.layers] + [layer.values for layer in cache.layers]

    def _flat(self, grads) -> torch.Tensor:
        return torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1)
                          for g, p in zip(grads, self.params, strict=True)])

    def _padded(self, proxies: list[torch.Tensor]) -> torch.Tensor:
        width = max(map(len, self.continuations))
        batch = torch.tensor([c + [c[-1]] * (width - len(c)) for c in self.continuations])
        cache = proxy_cache(list(zip(proxies[: self.layers], proxies[self.layers :], strict=True)))
        logits = self.model(input_ids=batch, past_key_values=cache, use_cache=True).logits
        return sum(_log_probs(logits[r, : len(c) - 1], c[1:]) for r, c in enumerate(self.continuations))

    def one_by_one(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        out = []
        for ids in self.continuations:
            proxies = [t.detach().requires_grad_() for t in self.outputs]
            cache = proxy_cache(list(zip(proxies[: self.layers], proxies[self.layers :], strict=True)))
            logits = model_logits(self.model, ids, torch.device("cpu"), cache, keep=len(ids))[:-1]
            grads = torch.autograd.grad(_log_probs(logits, ids[1:]), self.params + proxies, allow_unused=True)
            out.append((self._flat(grads[: len(self.params)]),
                        torch.cat([g.reshape(-1) for g in grads[len(self.params) :]])))
        return out

    def padded(self) -> torch.Tensor:
        n = len(self.continuations)
        proxies = [t.detach().requires_grad_() for t in self.outputs]
        expanded = [p.expand(n, -1, -1, -1) for p in proxies]
        return self._flat(torch.autograd.grad(self._padded(expanded), self.params, allow_unused=True))

    def per_sample(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        n = len(self.continuations)
        proxies = [t.detach().expand(n, *t.shape[1:]).clone().requires_grad_() for t in self.outputs]
        with PerSampleHooks(self.model, n) as hooks:
            total = self._padded(proxies)
        grads = torch.autograd.grad(total, hooks.targets() + proxies, allow_unused=True)
        flats = hooks.per_row(grads[: len(hooks.targets())], self.params)
        adjoints = grads[len(hooks.targets()) :]
        return [(flats[r], torch.cat([a[r].reshape(-1) for a in adjoints])) for r in range(n)]


class PerSampleHooks:
    """Records, during one forward of n rows, what per-row parameter gradients need (see the module docstring)."""

    def __init__(self, model, rows: int) -> None:
        self.model, self.rows = model, rows
        self.records: list[tuple[str, torch.nn.Module, torch.Tensor, torch.Tensor]] = []  # (kind, module, in, out)
        self.norms: list[tuple[torch.nn.Parameter, torch.Tensor]] = []  # (the weight, its per-row leaf)
        self.handles, self.swapped = [], []

    def __enter__(self) -> PerSampleHooks:
        try:
            self._install()
        except BaseException:
            self.__exit__()  # a refused module: the norms swapped so far get their Parameters back
            raise
        return self

    def _install(self) -> None:
        for module in self.model.modules():
            if isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
                kind = "linear" if isinstance(module, torch.nn.Linear) else "embedding"
                self.handles.append(module.register_forward_hook(
                    lambda m, i, o, kind=kind: self.records.append((kind, m, i[0], o))))
            elif type(module).__name__.endswith("RMSNorm"):
                weight = module._parameters.pop("weight")
                self.swapped.append((module, weight))
                self.handles.append(module.register_forward_pre_hook(partial_norm(self, weight)))
            elif any(p.requires_grad for p in module.parameters(recurse=False)):
                raise TypeError(f"no per-sample rule for {type(module).__name__}")

    def __exit__(self, *exc) -> None:
        for handle in self.handles:
            handle.remove()
        for module, weight in self.swapped:
            module.__dict__.pop("weight", None)  # the per-row leaf of the last forward, if any
            module._parameters["weight"] = weight
        self.handles, self.swapped = [], []

    def targets(self) -> list[torch.Tensor]:
        return [out for *_, out in self.records] + [leaf for _, leaf in self.norms]

    @torch.no_grad()
    def per_row(self, grads, params) -> torch.Tensor:
        """(rows, P) per-row parameter gradients in `params` order from the gradients of `targets()`."""
        offsets, at = {}, 0
        for p in params:
            offsets[id(p)] = (at, p)
            at += p.numel()
        flats = torch.zeros(self.rows, at)  # (filled in place from gradients: no graph)

        def view(p):
            start, _ = offsets[id(p)]
            return flats[:, start : start + p.numel()].view(self.rows, *p.shape)

        for (kind, module, x, _), d in zip(self.records, grads[: len(self.records)], strict=True):
            if d is None:
                continue
            if kind == "linear":
                view(module.weight).add_(torch.einsum("bto,bti->boi", d, x))
                if module.bias is not None:
                    view(module.bias).add_(d.sum(1))
            else:
                rows = view(module.weight)
                for r in range(self.rows):
                    rows[r].index_add_(0, x[r], d[r])
                    if module.padding_idx is not None:
                        rows[r, module.padding_idx] = 0.0  # as nn.Embedding's backward
        for (weight, _), d in zip(self.norms, grads[len(self.records) :], strict=True):
            view(weight).add_(d.reshape(self.rows, -1))
        return flats


def partial_norm(hooks: PerSampleHooks, weight: torch.nn.Parameter):
    def pre_hook(module, inputs):
        x = inputs[0]
        leaf = weight.detach().reshape((1,) * (x.dim() - 1) + (-1,))
        leaf = leaf.expand((hooks.rows,) + (1,) * (x.dim() - 2) + (-1,)).clone().requires_grad_()
        module.weight = leaf  # broadcasts over the row's positions (and heads): one weight copy per row
        hooks.norms.append((weight, leaf))
    return pre_hook


def measure(args) -> dict:
    torch.set_num_threads(args.threads)
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(tokenizer, hidden_size=args.hidden, num_layers=args.layers, seed=0)
    gen = torch.Generator().manual_seed(1)
    vocab = model.config.vocab_size
    prompt = torch.randint(0, vocab, (args.prompt,), generator=gen).tolist()
    lengths = [max(2, int(args.completion * (0.85 + 0.1 * k))) for k in range(args.members)]
    group = Group(model, prompt, [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in lengths])
    reference = group.one_by_one()
    rows = group.per_sample()
    errors = [max(float((g - rg).norm() / rg.norm()), float((a - ra).norm() / ra.norm()))
              for (g, a), (rg, ra) in zip(rows, reference, strict=True)]  # (gradients: no graph of their own)
    summed = sum(g for g, _ in reference)
    padded_error = float((group.padded() - summed).norm() / summed.norm())
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for _ in range(args.repeats):
        for variant in VARIANTS:
            start = time.perf_counter()
            getattr(group, variant)()
            times[variant].append(time.perf_counter() - start)
    medians = {v: statistics.median(ts) for v, ts in times.items()}
    return dict(shape=vars(args), member_tokens=lengths, per_sample_relative_error=max(errors),
                padded_relative_error=padded_error, wall_s=medians,
                vs_one_by_one={v: medians[v] / medians["one_by_one"] for v in VARIANTS})


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt", type=int, default=464, help="prompt tokens (quick-grading's)")
    parser.add_argument("--members", type=int, default=4)
    parser.add_argument("--completion", type=int, default=175, help="mean continuation tokens per member")
    parser.add_argument("--hidden", type=int, default=192)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (the benchmark runs use 1)")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", default="per_sample_design.json")
    result = measure(parser.parse_args(argv))
    print(f"{result['shape']['members']} members of ~{result['shape']['completion']} tokens over a "
          f"{result['shape']['prompt']}-token prompt, {result['shape']['threads']} thread(s), median of "
          f"{result['shape']['repeats']}: per-sample max relative error {result['per_sample_relative_error']:.1e}")
    for variant in VARIANTS:
        print(f"  {variant:<11} {result['wall_s'][variant] * 1e3:8.1f} ms  {result['vs_one_by_one'][variant]:.2f}x")
    with open(result["shape"]["out"], "w") as f:
        json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
