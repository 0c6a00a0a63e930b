//! Stop strings found across token boundaries.

/// Finds stop strings across token boundaries: text that might be the start
/// of a stop string is held back until it is known not to be.
pub(super) struct StopMatcher<'a> {
    stops: &'a [String],
    held: String,
    done: bool,
}

impl<'a> StopMatcher<'a> {
    pub(super) fn new(stops: &'a [String]) -> Self {
        StopMatcher { stops, held: String::new(), done: false }
    }

    /// Add generated text; returns the text that is safe to emit and whether a stop string was hit.
    pub(super) fn push(&mut self, piece: &str) -> (String, bool) {
        if self.done {
            return (String::new(), true);
        }
        self.held.push_str(piece);
        let active = self.stops.iter().filter(|s| !s.is_empty());
        // A complete stop string: emit what precedes the earliest one.
        if let Some(at) = active.clone().filter_map(|s| self.held.find(s.as_str())).min() {
            let emit = self.held[..at].to_string();
            self.held.clear();
            self.done = true;
            return (emit, true);
        }
        // Hold back the longest suffix that is a prefix of some stop string.
        let mut hold = 0;
        for s in active {
            for (i, _) in self.held.char_indices() {
                let suffix = &self.held[i..];
                if suffix.len() > hold && s.starts_with(suffix) {
                    hold = suffix.len();
                    break;
                }
            }
        }
        let cut = self.held.len() - hold;
        let emit = self.held[..cut].to_string();
        self.held.drain(..cut);
        (emit, false)
    }

    /// What is still held when generation ends without a stop.
    pub(super) fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::StopMatcher;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut m = StopMatcher::new(&stops);
        let mut out = String::new();
        for p in pieces {
            let (e, hit) = m.push(p);
            out.push_str(&e);
            if hit {
                return (out, true);
            }
        }
        out.push_str(&m.finish());
        (out, false)
    }

    #[test]
    fn stop_strings_split_across_pieces_are_never_emitted() {
        assert_eq!(run(&["</end>"], &["Hello </", "en", "d> more"]), ("Hello ".into(), true));
        assert_eq!(run(&["STOP"], &["aST", "OPb"]), ("a".into(), true));
        // A false start is released.
        assert_eq!(run(&["STOP"], &["aST", "x"]), ("aSTx".into(), false));
        // Held text at the end without a stop is released.
        assert_eq!(run(&["STOP"], &["abc", "ST"]), ("abcST".into(), false));
        // The earliest of several stops wins.
        assert_eq!(run(&["b", "zz"], &["azzb"]), ("a".into(), true));
        // Multi-byte text is cut at character boundaries.
        assert_eq!(run(&["éé"], &["xé", "é!"]), ("x".into(), true));
        assert_eq!(run(&[], &["free ", "text"]), ("free text".into(), false));
    }
}
