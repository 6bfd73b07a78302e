"""The scheduler: which sequences run in the next step, and how many of their tokens.

Each step has a token budget (`max_batched_tokens`) and a batch limit (`max_seqs`). The scheduler fills it
in this order:

  1. running sequences, oldest first: a decode token each, or the next chunk of a prompt that did
     not fit in one step (chunked prefill: long prompts run beside other sequences' decode tokens
     instead of stalling them);
  2. waiting requests, first come first served, while the budget, the batch limit and the free KV
     blocks allow (a request is admitted only if its whole prompt's blocks are free now).

When a running sequence needs a block and none is free, the newest running sequence is preempted
by recompute: its blocks go back to the pool and it returns to the front of the queue; when it is
admitted again its prompt and the tokens it had made are run again as a prompt (the prefix cache
may still hold them). Its sampling stream is untouched, so its tokens are the same as if it had
never been stopped.

Policies, the same code with different admission:

    continuous   admit whenever there is room (Orca's iteration-level scheduling; prompts that do
                 not fit the budget run in chunks beside decodes, as in Sarathi-Serve)
    static       admit a batch of up to max_seqs only when the last batch has finished
    sequential   static with one sequence: one request at a time
"""

from __future__ import annotations

from collections import deque

from ..errors import MiniLLMError
from .block_manager import BlockManager, Match
from .sequence import Sequence

POLICIES = ("continuous", "static", "sequential")


class Scheduler:
    def __init__(self, blocks: BlockManager, policy: str = "continuous", max_seqs: int = 16,
                 max_batched_tokens: int = 256) -> None:
        if policy not in POLICIES:
            raise MiniLLMError(f"policy {policy!r}: choose one of {', '.join(POLICIES)}")
        if max_seqs < 1 or max_batched_tokens < 1:
            raise MiniLLMError(f"max_seqs={max_seqs}, max_batched_tokens={max_batched_tokens}: "
                               "both must be at least 1")
        self.blocks = blocks
        self.policy = policy
        self.max_seqs = 1 if policy == "sequential" else max_seqs
        self.max_batched_tokens = max_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.preemptions = 0

    def check(self, seq: Sequence) -> None:
        """Could this request ever run here? A clear error if its prompt and answer need more KV memory
        than there is."""
        n = len(seq.prompt) + seq.max_new_tokens
        if not self.blocks.fits(n):
            raise MiniLLMError(
                f"a request of {len(seq.prompt)} prompt + {seq.max_new_tokens} new tokens needs "
                f"{self.blocks.blocks_for(n) + self.blocks.state_blocks} KV blocks"
                + (" (its state's included)" if self.blocks.state_blocks else "")
                + f", the pool has {self.blocks.num_blocks}: give more KV "
                "memory (--kv-memory) or ask for fewer tokens")

    def add(self, seq: Sequence) -> None:
        self.check(seq)
        i = len(self.waiting)                  # the queue stays in order of arrival
        while i and self.waiting[i - 1].arrival > seq.arrival:
            i -= 1
        self.waiting.insert(i, seq)

    def abort(self, seq: Sequence) -> None:
        """Drop a sequence wherever it is; its blocks go back at once."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.blocks.free(seq)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.blocks.free(seq)
        self.waiting.appendleft(seq)
        self.preemptions += 1

    def schedule(self, now: float = float("inf")) -> list[tuple[Sequence, int]]:
        """The next step: (sequence, tokens to run) pairs, their blocks already reserved. Requests
        that arrive after `now` wait. Empty when nothing can run."""
        budget, out = self.max_batched_tokens, []
        for s in list(self.running):
            if s not in self.running:          # preempted for an older sequence in this loop
                continue
            n = min(s.n_pending, budget)
            if n == 0:
                continue
            while not self.blocks.can_append(s, n):
                room = self.blocks.room(s)
                if room >= 1 and n > 1:        # a prompt chunk: run what fits
                    n = room
                    break
                self._preempt(self.running[-1])
                if s not in self.running:
                    break
            if s not in self.running:
                continue
            self.blocks.append(s, n)
            out.append((s, n))
            budget -= n
        if self.policy == "continuous" or not self.running:
            budget = self._admit(now, budget, out)
        return out

    def _admit(self, now: float, budget: int, out: list) -> int:
        chunked = self.policy != "continuous"   # a static batch is admitted whole and prefilled in chunks
        while self.waiting and len(self.running) < self.max_seqs and (budget > 0 or chunked):
            s = self.waiting[0]
            if s.arrival > now:
                break
            match = self.blocks.match(s)        # the prompt's hash chain, once per admission
            if not self.blocks.can_admit(s, match):
                break
            self.waiting.popleft()
            self.blocks.admit(s, match)         # the cached prefix shared, the rest's blocks reserved
            self.running.append(s)
            n = min(s.n_pending, budget)
            if n:
                out.append((s, n))
                budget -= n
        return budget

    def adopt(self, seq: Sequence, k, v) -> bool:
        """Put among the running a sequence whose prompt's KV was computed elsewhere (k, v [L, Hkv, T, hd]):
        the block manager admits it and writes them. False, nothing taken, when the batch is full
        or its blocks are not free now."""
        if len(self.running) >= self.max_seqs or not self.blocks.can_admit(seq, Match()):
            return False
        self.blocks.adopt(seq, k, v)
        self.running.append(seq)
        return True

    def finish_step(self, ran: list[tuple[Sequence, int]]) -> list[Sequence]:
        """After the step ran: name the new full blocks, free the finished. Returns the finished."""
        done = []
        for s, _ in ran:
            self.blocks.computed(s)
            if s.finished:
                self.running.remove(s)
                self.blocks.free(s)
                done.append(s)
        return done
