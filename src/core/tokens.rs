//! The one token counter: every budget (context packs, ambient snippets,
//! profiles) is counted in `o200k_base` tokens, the encoding of current OpenAI
//! chat models, so a budget means what the agent's context window means.

/// Tokens in `text` (special-token text counts as ordinary text).
pub fn count(text: &str) -> usize {
    if text.is_empty() {
        return 0;
    }
    tiktoken_rs::o200k_base_singleton()
        .encode_ordinary(text)
        .len()
}

/// The longest prefix of `text` within `budget` tokens, cut at a word boundary
/// and marked with an ellipsis when anything was cut; None when not even one
/// word fits.
pub fn truncate(text: &str, budget: usize) -> Option<String> {
    if count(text) <= budget {
        return Some(text.to_string());
    }
    let words: Vec<&str> = text.split_whitespace().collect();
    // Binary search the number of words whose prefix (plus "…") fits.
    let (mut lo, mut hi) = (0usize, words.len());
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        if count(&format!("{}…", words[..mid].join(" "))) <= budget {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    (lo > 0).then(|| format!("{}…", words[..lo].join(" ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_known_encodings() {
        assert_eq!(count(""), 0);
        assert_eq!(count("hello world"), 2);
        assert!(count("User prefers dark mode in all tools") >= 7);
    }

    #[test]
    fn truncation_fits_the_budget_at_a_word_boundary() {
        let text = "The dashboard deadline moved from April 15 to April 22 after the review";
        let cut = truncate(text, 6).unwrap();
        assert!(count(&cut) <= 6, "{cut}");
        assert!(cut.ends_with('…'));
        assert!(text.starts_with(cut.trim_end_matches('…')));
        assert_eq!(truncate(text, 1000).unwrap(), text);
        assert_eq!(truncate(text, 0), None);
    }
}
