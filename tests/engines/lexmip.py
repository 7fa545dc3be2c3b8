"""Solves mixed-integer programs exactly with HiGHS, each with several objectives
maximised in priority order (lexicographically): the best value of the first, then, among
the solutions that reach it, the best of the second, and so on.

    python lexmip.py programs.json solutions.json

(files, not the standard streams: HiGHS prints its banner on standard output).

The input is a JSON list of programs:

    {"columns": N,                       # variables, all binary
     "rows": [{"lower": L, "upper": U,   # L <= sum(value * x[index]) <= U
               "index": [...], "value": [...]}],
     "objectives": [{"index": [...], "value": [...]}],   # maximised, first first
     "time_limit": SECONDS}              # per objective

The output is a JSON list with, per program, `status` ("optimal", or what HiGHS said),
`values` (the 0/1 solution), `objectives` (each objective's value at it) and `seconds`
(HiGHS's own solve time, all objectives).
"""

import json
import sys

import highspy
import numpy as np

INF = highspy.kHighsInf


def solve(program):
    n = program["columns"]
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("threads", 1)
    # Exact: no relative gap; the absolute one below any difference between solutions.
    h.setOptionValue("mip_rel_gap", 0.0)
    h.setOptionValue("mip_abs_gap", 1e-9)
    h.setOptionValue("time_limit", float(program.get("time_limit", 60)))
    h.addVars(n, np.zeros(n), np.ones(n))
    h.changeColsIntegrality(n, np.arange(n, dtype=np.int32), np.array([highspy.HighsVarType.kInteger] * n))
    for row in program["rows"]:
        lower = -INF if row["lower"] is None else row["lower"]
        upper = INF if row["upper"] is None else row["upper"]
        h.addRow(lower, upper, len(row["index"]), np.array(row["index"], dtype=np.int32), np.array(row["value"], dtype=np.float64))
    h.changeObjectiveSense(highspy.ObjSense.kMaximize)
    seconds = 0.0
    reached = []
    values = [0.0] * n
    for objective in program["objectives"]:
        costs = np.zeros(n)
        costs[objective["index"]] = objective["value"]
        h.changeColsCost(n, np.arange(n, dtype=np.int32), costs)
        h.run()
        seconds += h.getRunTime()
        status = h.modelStatusToString(h.getModelStatus())
        if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
            return {"status": status, "values": [], "objectives": reached, "seconds": seconds}
        values = list(h.getSolution().col_value)
        value = float(np.dot(costs, values))
        reached.append(value)
        # Later objectives keep this one at its best (up to rounding in the last place).
        index = np.array(objective["index"], dtype=np.int32)
        h.addRow(value - 1e-9 * max(1.0, abs(value)), INF, len(index), index, np.array(objective["value"], dtype=np.float64))
    return {"status": "optimal", "values": [round(v) for v in values], "objectives": reached, "seconds": seconds}


def main():
    with open(sys.argv[1]) as f:
        programs = json.load(f)
    solutions = [solve(p) for p in programs]
    with open(sys.argv[2], "w") as f:
        json.dump(solutions, f)


if __name__ == "__main__":
    main()
