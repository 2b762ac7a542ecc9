"""``python -m portbench.reference [--engine-model lssp]``: bring the comparison chapter's stored
statistics (``data/results/reference/``) up to date for the book's parameters, as its notebook reads
them (the cross-source table, the reversal analysis and the reruns at other seeds)."""

import argparse
import time

from portbench import stored
from portbench.campaign import load_results
from portbench.reference import Cells, bootstrap_seed_check, compare_portability, compare_reversals, load_published
from portbench.regions import REGIONS
from portbench.store import default_data_dir

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--engine-model", default="lssp", help="the campaign table compared (default: lssp)")
args = parser.parse_args()
t0 = time.perf_counter()
table = load_results(args.engine_model)
regions = [r for r in REGIONS if r in set(table["region"])]
published = load_published(default_data_dir() / "reference" / "lssp_table_data")
cells = Cells()
compare_portability(cells, published["rq1_rq2_portability"], table, regions, **stored.BOOK_DEFAULTS)
rq3 = compare_reversals(cells, published["rq3_reversals"], table, regions, **stored.BOOK_DEFAULTS)
bootstrap_seed_check(cells, published["rq3_reversals"], table, regions, rq3.rev_all, **stored.BOOK_DEFAULTS)
print(f"the comparison chapter's stored statistics are current ({time.perf_counter() - t0:.1f} s)")
