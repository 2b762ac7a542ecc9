"""``vllm_style_token_budget``: shortest predicted output first, prompts charged in whole KV blocks."""

from ..engine.api import NEVER, Decision, Policy
from . import register
from ._common import admit_in_order


@register
class VllmStyleTokenBudget(Policy):
    """Shortest predicted output first with block-rounded KV charges.

    Key ``(O, arrival, id)`` ascending. A candidate is charged ``ceil(P / kv_block_size) *
    kv_block_size`` KV tokens (running requests count their exact prompt + decoded tokens), plus the
    usual sequence limit; the whole list is walked.

    Timer: the rounding over-counts same-step admissions, so a request skipped in a step that admitted
    something may fit one step later with no arrival or completion; its timer therefore asks for the
    next step after any step with admissions (and requests left waiting).

    kv_block_size: KV block size in tokens (16).
    """

    name = "vllm_style_token_budget"
    admission_only = True           # only admits, from the view alone

    def __init__(self, kv_block_size: int = 16):
        self.kv_block_size = kv_block_size

    def schedule(self, view):
        a, p, o = view.arrival_s, view.input_tokens, view.predicted_output_tokens
        block = self.kv_block_size
        ranked = sorted(view.waiting, key=lambda i: (int(o[i]), float(a[i]), i))
        admitted = admit_in_order(view, ranked, kv_charge=lambda i: -(-int(p[i]) // block) * block)
        left = len(view.waiting) > len(admitted)
        return Decision(admit=admitted, wake_after_steps=1 if admitted and left else NEVER)
