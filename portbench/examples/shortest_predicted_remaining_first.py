from portbench.policies import register
from portbench.queue import KeyPolicy


@register
class ShortestPredictedRemainingFirst(KeyPolicy):
    """Predicted output tokens still to produce, fewest first (ties: the queue's order)."""

    name = "shortest_predicted_remaining_first"

    def key(self, view, ids):
        return view.predicted_output_tokens[ids] - view.decoded[ids]
