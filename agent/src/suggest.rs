//! "Did you mean" for names the user misspelt.

/// The candidate closest to `wanted`, if one is close enough to be a likely typo
/// (Jaro-Winkler similarity of at least 0.8, ignoring case). Of equally close
/// candidates the first wins, so the answer does not depend on sort stability.
pub(crate) fn closest<'a>(wanted: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let wanted = wanted.to_lowercase();
    candidates
        .into_iter()
        .map(|candidate| (strsim::jaro_winkler(&wanted, &candidate.to_lowercase()), candidate))
        .filter(|(score, _)| *score >= 0.8)
        .fold(None, |best: Option<(f64, &'a str)>, (score, candidate)| match best {
            Some((best_score, _)) if best_score >= score => best,
            _ => Some((score, candidate)),
        })
        .map(|(_, candidate)| candidate)
}

#[cfg(test)]
mod tests {
    use super::closest;

    #[test]
    fn finds_typos_only() {
        let names = ["A100-80GB", "A100-40GB", "RTX4090-24GB"];
        assert_eq!(closest("A100-80G", names), Some("A100-80GB"));
        assert_eq!(closest("rtx4090", names), Some("RTX4090-24GB"));
        assert_eq!(closest("banana", names), None);
        assert_eq!(closest("rtx-3", ["a100-box", "rtx-1", "rtx-2"]), Some("rtx-1"));
    }
}
