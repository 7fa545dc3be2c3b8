//! Text cut to a size in bytes without splitting a character.

/// Cuts `text` to at most `max` bytes, at the last character boundary that fits.
/// Returns whether anything was cut.
pub fn truncate_at_char(text: &mut String, max: usize) -> bool {
    if text.len() <= max {
        return false;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    true
}

#[cfg(test)]
mod tests {
    use super::truncate_at_char;

    #[test]
    fn cuts_on_a_character_boundary() {
        let mut text = "añb".to_owned();
        assert!(truncate_at_char(&mut text, 2));
        assert_eq!(text, "a");
        let mut short = "ab".to_owned();
        assert!(!truncate_at_char(&mut short, 2));
        assert_eq!(short, "ab");
    }
}
