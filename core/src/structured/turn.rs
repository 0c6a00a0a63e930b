//! One request's structure as it is generated: thinking, then the answer
//! (free, or under its constraint), tool calls opened by their marker and
//! constrained until they close. The session asks for the next token's mask
//! (computed on a worker thread while the forward pass runs), samples under
//! it, and gives the turn the token; the turn says which text it adds to
//! which channel and which tokens it forces next (fast-forward, a closed
//! thought).
//!
//! Markers (`</think>`, `<tool_call>`) are matched as single tokens where
//! the vocabulary has them, else as text: bytes that may begin a marker are
//! held back until it is clear whether they do, and a token that runs past
//! a marker's end gives the rest of its bytes to what follows (the call's
//! grammar consumes them as tokens of the same bytes).

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::SimpleVob;
use llguidance::Matcher;

use super::harmony_turn::HarmonyTurn;
use super::reasoning::ThinkFormat;
use super::tools::{self, ParsedCall, ToolFormat};
use super::{compile, Grammars, Reasoning, ToolChoice, ToolSpec};
use crate::tokenizer::Tokenizer;
use crate::{Error, Result};

/// Where generated text goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Channel {
    Reasoning,
    Text,
}

/// What the turn says of an accepted token.
#[derive(Debug, Default)]
pub(crate) struct Step {
    /// Text released to the channels, in order.
    pub segments: Vec<(Channel, Vec<u8>)>,
    /// Tokens the turn appends without sampling (their text is in `segments`).
    pub forced: Vec<u32>,
}

impl Step {
    pub(super) fn push(&mut self, c: Channel, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        match self.segments.last_mut() {
            Some((last, b)) if *last == c => b.extend_from_slice(bytes),
            _ => self.segments.push((c, bytes.to_vec())),
        }
    }
}

/// The next token's mask.
pub(crate) enum Mask {
    /// Any token.
    Free,
    Allowed(SimpleVob),
    /// The answer's constraint is complete: the request ends.
    Complete,
}

/// A call that closed.
#[derive(Debug)]
pub(crate) enum Closed {
    Call(ParsedCall),
    /// Its text, when it did not parse (never expected under the grammar).
    Text(String),
}

/// The tools of a request as the turn uses them.
struct ToolPlan {
    format: ToolFormat,
    specs: Vec<ToolSpec>,
    /// The call grammar (Lark) after the open marker.
    grammar: String,
    /// The same from the open marker on (a forced call whose marker is text).
    grammar_with_open: String,
    /// The open marker, and its token where it is a single one.
    open: Option<&'static str>,
    open_id: Option<u32>,
    forced: bool,
}

pub(crate) struct Turn {
    grammars: Option<Arc<Grammars>>,
    think: Option<ThinkFormat>,
    show_special: bool,
    thinking: bool,
    think_tokens: usize,
    budget: Option<usize>,
    /// Whether the answer has begun.
    answer_started: bool,
    answer: Option<Matcher>,
    answer_done: bool,
    tools: Option<ToolPlan>,
    call: Option<Matcher>,
    /// The call's text so far (markers included), for the parser.
    call_bytes: Vec<u8>,
    /// At least one call closed: only another call or the end may follow.
    after_call: bool,
    closed: Vec<Closed>,
    n_calls: usize,
    /// Bytes that may begin a marker (the thought's close, a call's open).
    held: Vec<u8>,
    eog: Vec<u32>,
    n_vocab: usize,
    /// gpt-oss's harmony: its messages are routed by their own turn.
    harmony: Option<HarmonyTurn>,
}

impl Turn {
    /// A turn after the prompt `prompt_text`. `answer` is the request's
    /// constraint (compiled), `tools` its tools with the choice.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        tok: &Tokenizer,
        grammars: Option<Arc<Grammars>>,
        think: Option<ThinkFormat>,
        reasoning: Reasoning,
        prompt_text: &str,
        answer: Option<Matcher>,
        tools: Option<(ToolFormat, Vec<ToolSpec>, ToolChoice)>,
        show_special: bool,
    ) -> Result<Turn> {
        let is_harmony =
            think.as_ref().is_some_and(ThinkFormat::is_harmony) || matches!(&tools, Some((ToolFormat::Harmony, _, _)));
        let (answer, tools, harmony) = if is_harmony {
            let (specs, forced) = match &tools {
                None | Some((_, _, ToolChoice::Off)) => (Vec::new(), false),
                Some((_, specs, choice)) => {
                    (chosen_tools(specs, choice)?.into_iter().cloned().collect(), !matches!(choice, ToolChoice::Auto))
                }
            };
            let h = HarmonyTurn::new(tok, grammars.clone(), reasoning, prompt_text, answer, specs, forced)?;
            (None, None, Some(h))
        } else {
            (answer, tools, None)
        };
        let thinking = !is_harmony && think.as_ref().is_some_and(|f| f.open_at_end(prompt_text));
        let budget = match reasoning {
            Reasoning::Budget(n) => Some(n as usize),
            _ => None,
        };
        let plan = match tools {
            None | Some((_, _, ToolChoice::Off)) => None,
            Some((format, specs, choice)) => {
                let chosen = chosen_tools(&specs, &choice)?;
                let grammar = format.call_grammar(&chosen, tok, false)?;
                let grammar_with_open = format.call_grammar(&chosen, tok, true)?;
                let open = format.markers().map(|(open, _)| open);
                let open_id = open.and_then(|o| tok.token_id(o).filter(|&id| tok.token_piece(id) == o.as_bytes()));
                let forced = !matches!(choice, ToolChoice::Auto);
                let specs = chosen.into_iter().cloned().collect();
                Some(ToolPlan { format, specs, grammar, grammar_with_open, open, open_id, forced })
            }
        };
        if plan.is_some() && grammars.is_none() {
            return Err(Error::InvalidArgument("tools: no constraint engine for this vocabulary".into()));
        }
        let turn = Turn {
            grammars,
            think,
            show_special,
            thinking,
            think_tokens: 0,
            budget,
            answer_started: false,
            answer,
            answer_done: false,
            tools: plan,
            call: None,
            call_bytes: Vec::new(),
            after_call: false,
            closed: Vec::new(),
            n_calls: 0,
            held: Vec::new(),
            eog: tok.end_of_generation_tokens().collect(),
            n_vocab: tok.n_vocab(),
            harmony,
        };
        // Compile the call grammars now: a bad tool is an error before any token.
        if let Some(p) = &turn.tools {
            turn.call_matcher(&p.grammar)?;
            turn.call_matcher(&p.grammar_with_open)?;
        }
        Ok(turn)
    }

    /// The calls closed since the last time (parsed; one that did not
    /// parse comes back as its text).
    pub(crate) fn take_closed(&mut self) -> Vec<Closed> {
        if let Some(h) = self.harmony.as_mut() {
            return h.take_closed();
        }
        std::mem::take(&mut self.closed)
    }

    /// How many calls this turn made.
    pub(crate) fn n_calls(&self) -> usize {
        self.harmony.as_ref().map_or(self.n_calls, HarmonyTurn::n_calls)
    }

    /// Whether the turn computes masks (a constraint or tools): the
    /// session then computes them beside the forward pass.
    pub(crate) fn is_structured(&self) -> bool {
        self.answer.is_some() || self.tools.is_some() || self.harmony.as_ref().is_some_and(HarmonyTurn::structured)
    }

    pub(crate) fn think_header(&self) -> &'static str {
        self.think.as_ref().map_or("", |f| f.header)
    }

    fn call_matcher(&self, grammar: &str) -> Result<Matcher> {
        let g = self.grammars.as_ref().ok_or_else(|| Error::InvalidArgument("tools: no constraint engine".into()))?;
        compile(g, TopLevelGrammar::from_lark(grammar.to_string()), "tools")
    }

    fn eog_set(&self) -> SimpleVob {
        let mut v = SimpleVob::alloc(self.n_vocab);
        for &t in &self.eog {
            v.allow_token(t);
        }
        v
    }

    /// The mask of the next token.
    pub(crate) fn mask(&mut self) -> Result<Mask> {
        if let Some(h) = self.harmony.as_mut() {
            return h.mask();
        }
        if self.thinking {
            return Ok(Mask::Free);
        }
        if let Some(m) = self.call.as_mut() {
            let mask =
                if m.is_stopped() { None } else { Some(m.compute_mask().map_err(|e| engine_error("tools", e))?) };
            return match mask {
                Some(mask) if !only_eog(&self.eog, &mask) => Ok(Mask::Allowed(mask)),
                _ => {
                    self.close_call();
                    self.mask()
                }
            };
        }
        if let Some(p) = &self.tools {
            if self.after_call {
                // Another call or the end; text after calls is not an answer.
                let mut v = self.eog_set();
                match p.open_id {
                    Some(open) => v.allow_token(open),
                    None if p.open.is_some() => {
                        // A marker spelled in several tokens: the next call's
                        // grammar from its marker, or nothing (the end).
                        let m = self.call_matcher(&after_grammar(&p.grammar_with_open))?;
                        self.call = Some(m);
                        self.call_bytes.clear();
                        return self.mask();
                    }
                    None => {}
                }
                return Ok(Mask::Allowed(v));
            }
            if p.forced && !self.answer_started {
                if let Some(open) = p.open_id {
                    let mut v = SimpleVob::alloc(self.n_vocab);
                    v.allow_token(open);
                    return Ok(Mask::Allowed(v));
                }
                // The call is the answer from its first token (its marker is text, or it has none).
                let m = self.call_matcher(&p.grammar_with_open)?;
                self.call = Some(m);
                self.call_bytes.clear();
                self.answer_started = true;
                return self.mask();
            }
        }
        if self.answer_done {
            return Ok(Mask::Complete);
        }
        let open_think = self.think.as_ref().and_then(|f| f.open_id).filter(|_| !self.answer_started);
        let Some(m) = self.answer.as_mut() else { return Ok(Mask::Free) };
        if m.is_stopped() {
            self.answer_done = true;
            return Ok(Mask::Complete);
        }
        let mut mask = m.compute_mask().map_err(|e| engine_error("constraint", e))?;
        if self.answer_started && only_eog(&self.eog, &mask) && m.is_accepting().unwrap_or(false) {
            self.answer_done = true;
            return Ok(Mask::Complete);
        }
        if mask.is_zero() {
            return Err(Error::InvalidArgument("constraint: no token can continue the answer".into()));
        }
        // A model may open a thought before a constrained answer.
        if let Some(t) = open_think {
            mask.allow_token(t);
        }
        Ok(Mask::Allowed(mask))
    }

    /// How many of `drafts` (speculative decoding's) the structure lets
    /// through in a row: the answer's constraint, or the open call's grammar,
    /// validates them without consuming them; the rest would only be
    /// rejected. Where the turn may change state among them (a thought, a
    /// call's marker, harmony's channels) all of them: every verified row is
    /// sampled under its own mask anyway, so this only saves work.
    pub(crate) fn allowed_prefix(&mut self, drafts: &[u32]) -> Result<usize> {
        if drafts.is_empty() || self.harmony.is_some() || self.thinking {
            return Ok(drafts.len());
        }
        // Ids the vocabulary lacks (a draft model's padded head) stop the drafts.
        let known = drafts.iter().position(|&t| t as usize >= self.n_vocab).unwrap_or(drafts.len());
        let may_think = !self.answer_started && self.think.as_ref().is_some_and(|f| f.open_id.is_some());
        let (m, what) = match (self.call.as_mut(), self.tools.is_some(), self.answer.as_mut()) {
            (Some(m), _, _) => (m, "tools"),
            (None, false, Some(m)) if !may_think => (m, "constraint"),
            _ => return Ok(drafts.len()),
        };
        m.validate_tokens(&drafts[..known]).map_err(|e| engine_error(what, e))
    }

    /// The model would end while thinking but the answer owes a constrained
    /// answer or a call: the thought is closed instead (the end token is
    /// dropped) and the answer begins.
    pub(crate) fn close_thought_instead_of_ending(&mut self, tok: &Tokenizer) -> Result<Option<Step>> {
        if let Some(h) = self.harmony.as_mut() {
            return h.close_instead_of_ending();
        }
        let owes = self.answer.is_some() || self.tools.as_ref().is_some_and(|p| p.forced);
        let Some(f) = self.think.clone().filter(|_| self.thinking && owes) else { return Ok(None) };
        let mut step = Step::default();
        self.close_thought(tok, &f, &mut step)?;
        Ok(Some(step))
    }

    /// JSON-form tools under `Auto`: the answer's first token opening with
    /// `{` starts a call; the caller samples again under the call's mask.
    pub(crate) fn opens_json_call(&mut self, token: u32, tok: &Tokenizer) -> Result<bool> {
        let Some(p) = &self.tools else { return Ok(false) };
        if self.thinking || self.answer_started || self.call.is_some() || p.open.is_some() || p.forced {
            return Ok(false);
        }
        let first = tok.token_piece(token).iter().find(|b| !b.is_ascii_whitespace());
        if first != Some(&b'{') {
            return Ok(false);
        }
        let m = self.call_matcher(&p.grammar)?;
        self.call = Some(m);
        self.call_bytes.clear();
        Ok(true)
    }

    /// Take a sampled token.
    pub(crate) fn accept(&mut self, token: u32, tok: &Tokenizer) -> Result<Step> {
        if let Some(h) = self.harmony.as_mut() {
            return h.accept(token, tok);
        }
        let mut step = Step::default();
        if let Some(f) = self.think.clone() {
            if self.thinking {
                self.think_token(token, tok, &f, &mut step)?;
                return Ok(step);
            }
            if !self.answer_started && self.call.is_none() && f.open_id == Some(token) {
                self.thinking = true;
                if self.budget == Some(0) {
                    self.close_thought(tok, &f, &mut step)?;
                }
                return Ok(step);
            }
        }
        self.answer_token(token, tok, &mut step)?;
        Ok(step)
    }

    fn think_token(&mut self, token: u32, tok: &Tokenizer, f: &ThinkFormat, step: &mut Step) -> Result<()> {
        if f.close_id == Some(token) {
            step.push(Channel::Reasoning, &std::mem::take(&mut self.held));
            self.thinking = false;
            return Ok(());
        }
        self.think_tokens += 1;
        self.held.extend_from_slice(tok.visible_piece(token, self.show_special));
        if let Some(at) = find(&self.held, f.close.as_bytes()) {
            let held = std::mem::take(&mut self.held);
            step.push(Channel::Reasoning, &held[..at]);
            self.thinking = false;
            let rest = &held[at + f.close.len()..];
            return self.answer_bytes(rest, step);
        }
        let keep = partial_suffix(&self.held, f.close.as_bytes());
        let release: Vec<u8> = self.held.drain(..self.held.len() - keep).collect();
        step.push(Channel::Reasoning, &release);
        if self.budget.is_some_and(|b| self.think_tokens >= b) {
            self.close_thought(tok, f, step)?;
        }
        Ok(())
    }

    /// End the thought now (its budget is spent): the close marker is forced.
    fn close_thought(&mut self, tok: &Tokenizer, f: &ThinkFormat, step: &mut Step) -> Result<()> {
        step.push(Channel::Reasoning, &std::mem::take(&mut self.held));
        self.thinking = false;
        step.forced = tok.encode(f.close_text, false, true)?;
        Ok(())
    }

    fn answer_token(&mut self, token: u32, tok: &Tokenizer, step: &mut Step) -> Result<()> {
        self.answer_started = true;
        if let Some(m) = self.call.as_mut() {
            m.consume_token(token).map_err(|e| engine_error("tools", e))?;
            self.call_bytes.extend_from_slice(tok.token_piece(token));
            let ff = take_forced(m);
            for &t in &ff {
                self.call_bytes.extend_from_slice(tok.token_piece(t));
            }
            step.forced = ff;
            return Ok(());
        }
        if let Some(p) = &self.tools {
            if p.open_id.is_some() && p.open_id == Some(token) {
                let m = self.call_matcher(&p.grammar)?;
                self.call = Some(m);
                self.call_bytes = tok.token_piece(token).to_vec();
                return Ok(());
            }
        }
        if let Some(m) = self.answer.as_mut() {
            m.consume_token(token).map_err(|e| engine_error("constraint", e))?;
            step.push(Channel::Text, tok.visible_piece(token, self.show_special));
            let ff = take_forced(m);
            for &t in &ff {
                step.push(Channel::Text, tok.visible_piece(t, self.show_special));
            }
            step.forced = ff;
            return Ok(());
        }
        self.answer_bytes(tok.visible_piece(token, self.show_special), step)
    }

    /// Answer text that came as bytes (after a marker inside a token, or
    /// any token where a text marker may open a call).
    fn answer_bytes(&mut self, bytes: &[u8], step: &mut Step) -> Result<()> {
        if bytes.is_empty() {
            return Ok(());
        }
        self.answer_started = true;
        if let Some(m) = self.answer.as_mut() {
            // The rest of the token that closed a thought: its bytes as tokens.
            let trimmed = trim_start_ws(bytes);
            let env = m.tok_env().map_err(|e| engine_error("constraint", e))?;
            let ids = env.tokenize_bytes(trimmed);
            if m.validate_tokens(&ids).ok() == Some(ids.len()) {
                m.consume_tokens(&ids).map_err(|e| engine_error("constraint", e))?;
                step.push(Channel::Text, trimmed);
            }
            return Ok(());
        }
        let text_marker = self.tools.as_ref().filter(|p| p.open_id.is_none()).and_then(|p| p.open);
        let Some(open) = text_marker else {
            step.push(Channel::Text, bytes);
            return Ok(());
        };
        if let Some(m) = self.call.as_mut() {
            let env = m.tok_env().map_err(|e| engine_error("tools", e))?;
            let ids = env.tokenize_bytes(bytes);
            m.consume_tokens(&ids).map_err(|e| engine_error("tools", e))?;
            self.call_bytes.extend_from_slice(bytes);
            return Ok(());
        }
        self.held.extend_from_slice(bytes);
        let Some(at) = find(&self.held, open.as_bytes()) else {
            let keep = partial_suffix(&self.held, open.as_bytes());
            let release: Vec<u8> = self.held.drain(..self.held.len() - keep).collect();
            step.push(Channel::Text, &release);
            return Ok(());
        };
        let held = std::mem::take(&mut self.held);
        step.push(Channel::Text, &held[..at]);
        let rest = &held[at + open.len()..];
        let grammar = self.tools.as_ref().map(|p| p.grammar.clone()).unwrap_or_default();
        let mut m = self.call_matcher(&grammar)?;
        let env = m.tok_env().map_err(|e| engine_error("tools", e))?;
        let ids = env.tokenize_bytes(rest);
        if m.validate_tokens(&ids).ok() == Some(ids.len()) && m.consume_tokens(&ids).is_ok() {
            self.call = Some(m);
            self.call_bytes = held[at..].to_vec();
        } else {
            // Not a call after all: the marker is text.
            step.push(Channel::Text, &held[at..]);
        }
        Ok(())
    }

    /// Text still held back at the end of generation.
    pub(crate) fn finish(&mut self) -> Step {
        if let Some(h) = self.harmony.as_mut() {
            return h.finish();
        }
        let mut step = Step::default();
        let c = if self.thinking { Channel::Reasoning } else { Channel::Text };
        step.push(c, &std::mem::take(&mut self.held));
        step
    }

    /// A call's grammar completed: parse it.
    fn close_call(&mut self) {
        self.call = None;
        self.after_call = true;
        let bytes = std::mem::take(&mut self.call_bytes);
        let Some(p) = &self.tools else { return };
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return;
        }
        let text = String::from_utf8_lossy(&bytes).into_owned();
        let (_, mut calls) = tools::parse_tool_calls(p.format, &text, &p.specs);
        if calls.len() == 1 {
            self.n_calls += 1;
            self.closed.push(Closed::Call(calls.remove(0)));
        } else {
            self.closed.push(Closed::Text(text));
        }
    }
}

/// The tools a choice allows: one by name, else all.
fn chosen_tools<'a>(specs: &'a [ToolSpec], choice: &ToolChoice) -> Result<Vec<&'a ToolSpec>> {
    match choice {
        ToolChoice::Named(name) => {
            let t = specs.iter().find(|t| &t.name == name).ok_or_else(|| {
                Error::InvalidArgument(format!("tool_choice: no tool named '{name}' among the tools"))
            })?;
            Ok(vec![t])
        }
        _ => Ok(specs.iter().collect()),
    }
}

/// A call grammar that may also match nothing (after a call: another or the end).
fn after_grammar(with_open: &str) -> String {
    let body = with_open.replacen("start:", "one_more:", 1);
    format!("start: (\"\\n\"? one_more)?\n{body}")
}

/// Most tokens forced at once: a grammar may force hundreds of thousands
/// (a long literal repetition), taken a bounded number per step.
const MAX_FORCED: usize = 64;

/// The tokens the grammar forces next (at most [`MAX_FORCED`]), consumed.
pub(super) fn take_forced(m: &mut Matcher) -> Vec<u32> {
    let mut ff = m.compute_ff_tokens();
    ff.truncate(MAX_FORCED);
    if ff.is_empty() || m.consume_tokens(&ff).is_err() {
        return Vec::new();
    }
    ff
}

/// Whether `mask` allows nothing but ending.
pub(super) fn only_eog(eog: &[u32], mask: &SimpleVob) -> bool {
    mask.num_set() == eog.iter().filter(|&&t| mask.is_allowed(t)).count()
}

/// Where `needle` first occurs in `hay`.
pub(super) fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The length of the longest suffix of `hay` that begins `marker` (held back).
pub(super) fn partial_suffix(hay: &[u8], marker: &[u8]) -> usize {
    (1..marker.len().min(hay.len() + 1)).rev().find(|&n| hay[hay.len() - n..] == marker[..n]).unwrap_or(0)
}

fn trim_start_ws(b: &[u8]) -> &[u8] {
    let n = b.iter().take_while(|c| c.is_ascii_whitespace()).count();
    &b[n..]
}

pub(super) fn engine_error(what: &str, e: impl std::fmt::Display) -> Error {
    Error::InvalidArgument(format!("{what}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::partial_suffix;

    #[test]
    fn held_suffixes() {
        assert_eq!(partial_suffix(b"abc <tool", b"<tool_call>"), 5);
        assert_eq!(partial_suffix(b"abc", b"<tool_call>"), 0);
        assert_eq!(partial_suffix(b"<", b"<tool_call>"), 1);
        assert_eq!(partial_suffix(b"", b"<tool_call>"), 0);
    }
}
