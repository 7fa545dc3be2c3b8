//! "Did you mean" for names the user misspelt.

/// How alike a candidate must be to the name written ([`likeness`]) to be offered as
/// what was meant.
pub const LIKELY_TYPO: f64 = 0.8;

/// How alike `candidate` is to `wanted` (Jaro-Winkler similarity, 0 to 1, ignoring
/// case), when it is alike enough to be a likely typo ([`LIKELY_TYPO`]); `None`
/// otherwise.
pub fn likeness(wanted: &str, candidate: &str) -> Option<f64> {
    let score = strsim::jaro_winkler(&wanted.to_lowercase(), &candidate.to_lowercase());
    (score >= LIKELY_TYPO).then_some(score)
}

/// The candidate closest to `wanted`, if one is a likely typo of it ([`likeness`]). Of
/// equally close candidates the first wins, so the answer depends only on the order
/// given, not on sort stability.
pub fn closest<'a>(wanted: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    candidates
        .into_iter()
        .filter_map(|candidate| Some((likeness(wanted, candidate)?, candidate)))
        .fold(None, |best: Option<(f64, &'a str)>, (score, candidate)| match best {
            Some((best_score, _)) if best_score >= score => best,
            _ => Some((score, candidate)),
        })
        .map(|(_, candidate)| candidate)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_typos_only() {
        let names = ["A100-80GB", "A100-40GB", "RTX4090-24GB"];
        assert_eq!(closest("A100-80G", names), Some("A100-80GB"));
        assert_eq!(closest("rtx4090", names), Some("RTX4090-24GB"));
        assert_eq!(closest("banana", names), None);
        assert_eq!(closest("anything", []), None);
    }

    #[test]
    fn of_equally_close_the_first_wins() {
        assert_eq!(closest("rtx-3", ["a100-box", "rtx-1", "rtx-2"]), Some("rtx-1"));
        assert_eq!(closest("rtx-3", ["a100-box", "rtx-2", "rtx-1"]), Some("rtx-2"));
    }

    #[test]
    fn case_is_ignored_and_the_threshold_holds() {
        assert_eq!(likeness("MODEL", "model"), Some(1.0));
        assert!(likeness("steps", "agents").is_none());
        assert!(likeness("promt", "prompt").is_some_and(|s| s >= LIKELY_TYPO));
    }
}
