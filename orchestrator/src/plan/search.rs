//! The search over replicas: depth-first, best candidate first, with a bound that
//! prunes branches that cannot beat the best plan found. The first leaf is the greedy
//! plan; on a large fleet it usually meets the bound at once. The objective is, first,
//! the number of replicas placed, then the sum of their scores.

use super::fleet::PlanFleet;
use super::options::{Cand, Family, FleetState, State, Unit};

/// What the search found.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The candidate chosen for each unit (by unit position), `None` when unplaced.
    pub chosen: Vec<Option<Cand>>,
    /// Units placed.
    pub placed: usize,
    /// Sum of the chosen candidates' scores.
    pub score: i128,
    /// Candidates tried.
    pub steps: u64,
    /// Whether the search ran to the end (so the plan is optimal for the objective);
    /// `false` when the step budget stopped it (the plan is the best found).
    pub complete: bool,
}

/// The best choice of candidates for `units` on `fleet`, from `state` (nothing reserved
/// yet; it is as it was when the search returns), trying at most `budget` candidates
/// after the first (greedy) plan.
///
/// The search visits units in [`visiting_order`]. When its best plan leaves a unit
/// unplaced or on a last resort (host RAM, CPU), it searches again with each such unit
/// moved last in turn, keeping the best plan of all: what the first order placed early
/// can then be placed around it (a smaller variant that leaves a GPU free for it).
pub fn search(units: &[&Unit<'_>], fleet: &PlanFleet, state: &mut State, budget: u64) -> Outcome {
    // Each unit's best score on the untouched fleet bounds what it can reach later:
    // reserving memory only removes candidates.
    let best_alone: Vec<Option<i64>> = units
        .iter()
        .map(|u| u.best_bound(FleetState::new(fleet, state)).map(|c| c.score))
        .collect();
    let first = visiting_order(units, fleet, state);
    let mut search = Search {
        units,
        fleet,
        order: Vec::new(),
        suffix: Vec::new(),
        best: None,
        current: vec![None; units.len()],
        steps: 0,
        budget: budget.max(units.len() as u64),
        truncated: false,
    };
    search.run(first.clone(), &best_alone, state);
    let lagging: Vec<usize> = first
        .iter()
        .copied()
        .filter(|&u| {
            search.best.as_ref().is_some_and(|(_, _, chosen)| {
                chosen[u]
                    .as_ref()
                    .is_none_or(|c| matches!(c.family, Family::Offload | Family::Cpu))
            }) && best_alone[u].is_some()
        })
        .collect();
    for u in lagging {
        if search.truncated {
            break;
        }
        let mut order: Vec<usize> = first.iter().copied().filter(|&x| x != u).collect();
        order.push(u);
        search.run(order, &best_alone, state);
    }
    let (placed, score, chosen) = search.best.unwrap_or((0, 0, vec![None; units.len()]));
    Outcome {
        chosen,
        placed,
        score,
        steps: search.steps,
        complete: !search.truncated,
    }
}

/// The order the search places units in: hardest first (units whose best candidate
/// reserves the most memory), then those without any candidate (skipped at once); ties
/// by position. A layer split's partition follows the memory free when its unit is
/// placed, so the order is part of the candidate space the search is exact over.
pub fn visiting_order(units: &[&Unit<'_>], fleet: &PlanFleet, state: &State) -> Vec<usize> {
    let mut order: Vec<usize> = (0..units.len()).collect();
    let weight: Vec<u64> = units
        .iter()
        .map(|u| {
            u.best(FleetState::new(fleet, state))
                .map_or(0, |c| c.reserve.iter().sum::<u64>())
        })
        .collect();
    order.sort_by(|&a, &b| weight[b].cmp(&weight[a]).then(a.cmp(&b)));
    order
}

struct Search<'s, 'a> {
    units: &'s [&'s Unit<'a>],
    fleet: &'s PlanFleet,
    order: Vec<usize>,
    suffix: Vec<(usize, i128)>,
    best: Option<(usize, i128, Vec<Option<Cand>>)>,
    current: Vec<Option<Cand>>,
    steps: u64,
    budget: u64,
    truncated: bool,
}

impl Search<'_, '_> {
    /// One depth-first search in `order`, keeping the best plan found so far.
    fn run(&mut self, order: Vec<usize>, best_alone: &[Option<i64>], state: &mut State) {
        let mut suffix = vec![(0usize, 0i128); order.len() + 1];
        for depth in (0..order.len()).rev() {
            let (placed, score) = suffix[depth + 1];
            suffix[depth] = match best_alone[order[depth]] {
                Some(s) => (placed + 1, score + i128::from(s)),
                None => (placed, score),
            };
        }
        self.order = order;
        self.suffix = suffix;
        self.dfs(0, state, 0, 0);
    }

    fn beats_best(&self, placed: usize, score: i128) -> bool {
        self.best.as_ref().is_none_or(|(p, s, _)| (placed, score) > (*p, *s))
    }

    fn dfs(&mut self, depth: usize, state: &mut State, placed: usize, score: i128) {
        if depth == self.order.len() {
            if self.beats_best(placed, score) {
                self.best = Some((placed, score, self.current.clone()));
            }
            return;
        }
        let (more, bound) = self.suffix[depth];
        if self.best.is_some() && !self.beats_best(placed + more, score + bound) {
            return;
        }
        let u = self.order[depth];
        let (rest_placed, rest_bound) = self.suffix[depth + 1];
        // The candidates best first: those on GPUs, then the last resorts (which score
        // below all of them), computed only if the search gets that far.
        let unit = self.units[u];
        'sections: for last_resorts in [false, true] {
            let cands = if last_resorts {
                unit.last_resorts(FleetState::new(self.fleet, state))
            } else {
                unit.gpu_candidates(FleetState::new(self.fleet, state))
            };
            for cand in cands.iter() {
                if self.best.is_some() {
                    if self.steps >= self.budget {
                        self.truncated = true;
                        return;
                    }
                    // Candidates come best first: once one cannot beat the best, none can.
                    if !self.beats_best(placed + 1 + rest_placed, score + i128::from(cand.score) + rest_bound) {
                        break 'sections;
                    }
                }
                self.steps += 1;
                state.apply(&cand);
                let gained = i128::from(cand.score);
                self.current[u] = Some(cand);
                self.dfs(depth + 1, state, placed + 1, score + gained);
                if let Some(cand) = self.current[u].take() {
                    state.undo(&cand);
                }
                if self.truncated {
                    return;
                }
            }
        }
        // Leaving this unit unplaced.
        self.dfs(depth + 1, state, placed, score);
    }
}
