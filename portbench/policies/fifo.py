"""``fifo``: arrival order; a request that does not fit is skipped and the walk goes on."""

from ..sim import Decision, Policy
from . import register


@register
class Fifo(Policy):
    name = "fifo"

    def schedule(self, view):
        m = view.model
        active, kv = view.n_active, view.kv_used
        admit = []
        for i in view.waiting:
            prompt = int(view.input_tokens[i])
            if active + 1 <= m.max_active_sequences and kv + prompt <= m.max_kv_tokens:
                admit.append(i)
                active += 1
                kv += prompt
        return Decision(admit=admit)
