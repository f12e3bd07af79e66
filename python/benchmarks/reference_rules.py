"""Baselines the 1.6.1 reference wheel lacks, written out from the reference's later source."""


class RefThinkingBudget:
    """The reference's thinking budget rule (its later source), in plain Python and torch."""

    def __init__(self, start, end, newline, max_thinking_tokens, overflow_percentage=0.1):
        self.start, self.end, self.newline = start, end, newline
        self.max = max_thinking_tokens
        self.overflow = int(max_thinking_tokens * overflow_percentage)

    def __call__(self, input_ids, logits):
        if self.start == 0 or self.end == 0:
            return
        last_start = -1
        for i in range(len(input_ids) - 1, -1, -1):
            if input_ids[i] == self.start:
                last_start = i
                break
        if last_start == -1:
            return
        for token in input_ids[last_start + 1 :]:
            if token == self.end:
                return
        n = len(input_ids) - last_start - 1
        if n < self.max:
            return
        if input_ids[-1] == self.newline or n >= self.max + self.overflow:
            logits.fill_(float("-inf"))
            logits[self.end] = 0.0
