//! One request's structure as it is generated: thinking, then the answer
//! (free, or under its constraint), tool calls opened by their marker and
//! constrained until they close. The session asks for the next token's mask
//! (computed on a worker thread while the forward pass runs), samples under
//! it, and tells the turn the token; the turn says which channel the token
//! belongs to and which tokens it forces next (fast-forward, a closed thought).

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::SimpleVob;
use llguidance::Matcher;

use super::reasoning::ThinkFormat;
use super::tools::{self, ParsedCall, ToolFormat};
use super::{compile, Grammars, Reasoning, ToolChoice, ToolSpec};
use crate::tokenizer::Tokenizer;
use crate::{Error, Result};

/// Where a generated token's text goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Channel {
    /// A thought marker or a call's open marker: not shown.
    Marker,
    Reasoning,
    Text,
    /// Inside a tool call (reported as the parsed call when it closes).
    Call,
}

/// What the turn says of an accepted token.
#[derive(Debug)]
pub(crate) struct Step {
    pub channel: Channel,
    /// Tokens the turn appends without sampling, in `forced_channel`.
    pub forced: Vec<u32>,
    pub forced_channel: Channel,
}

/// The next token's mask.
pub(crate) enum Mask {
    /// Any token.
    Free,
    Allowed(SimpleVob),
    /// The answer's constraint is complete: the request ends.
    Complete,
}

/// The tools of a request as the turn uses them.
struct ToolPlan {
    format: ToolFormat,
    specs: Vec<ToolSpec>,
    /// The call grammar (Lark), started when a call opens.
    grammar: String,
    /// The open marker's token (formats with markers).
    open: Option<u32>,
    forced: bool,
}

pub(crate) struct Turn {
    grammars: Option<Arc<Grammars>>,
    think: Option<ThinkFormat>,
    thinking: bool,
    think_tokens: usize,
    budget: Option<usize>,
    /// Whether the answer has begun (its first token sampled).
    answer_started: bool,
    answer: Option<Matcher>,
    answer_done: bool,
    tools: Option<ToolPlan>,
    call: Option<Matcher>,
    call_tokens: Vec<u32>,
    /// At least one call closed: only another call or the end may follow.
    after_call: bool,
    /// Calls closed since the session last took them.
    closed: Vec<Closed>,
    n_calls: usize,
    eog: Vec<u32>,
    n_vocab: usize,
}

impl Turn {
    /// A turn for a prompt of `prompt` tokens. `answer` is the request's
    /// constraint (already compiled), `tools` its tools with the choice.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        tok: &Tokenizer,
        grammars: Option<Arc<Grammars>>,
        think: Option<ThinkFormat>,
        reasoning: Reasoning,
        prompt: &[u32],
        answer: Option<Matcher>,
        tools: Option<(ToolFormat, Vec<ToolSpec>, ToolChoice)>,
    ) -> Result<Turn> {
        let thinking = think.as_ref().is_some_and(|f| f.open_at_end(tok, prompt));
        let budget = match reasoning {
            Reasoning::Budget(n) => Some(n as usize),
            _ => None,
        };
        let plan = match tools {
            None => None,
            Some((_, _, ToolChoice::Off)) => None,
            Some((format, specs, choice)) => {
                let chosen: Vec<&ToolSpec> = match &choice {
                    ToolChoice::Named(name) => {
                        let t = specs.iter().find(|t| &t.name == name).ok_or_else(|| {
                            Error::InvalidArgument(format!("tool_choice: no tool named '{name}' among the tools"))
                        })?;
                        vec![t]
                    }
                    _ => specs.iter().collect(),
                };
                let grammar = format.call_grammar(&chosen, tok)?;
                let open = match format.markers() {
                    Some((open, _)) => Some(tok.token_id(open).ok_or_else(|| {
                        Error::InvalidArgument(format!("tools: the vocabulary has no '{open}' token"))
                    })?),
                    None => None,
                };
                let forced = !matches!(choice, ToolChoice::Auto);
                let specs = chosen.into_iter().cloned().collect();
                Some(ToolPlan { format, specs, grammar, open, forced })
            }
        };
        if plan.is_some() && grammars.is_none() {
            return Err(Error::InvalidArgument("tools: no constraint engine for this vocabulary".into()));
        }
        let turn = Turn {
            grammars,
            think,
            thinking,
            think_tokens: 0,
            budget,
            answer_started: false,
            answer,
            answer_done: false,
            tools: plan,
            call: None,
            call_tokens: Vec::new(),
            after_call: false,
            closed: Vec::new(),
            n_calls: 0,
            eog: tok.end_of_generation_tokens().collect(),
            n_vocab: tok.n_vocab(),
        };
        // Compile the call grammar now: a bad tool is an error before any token.
        if let Some(p) = &turn.tools {
            let m = turn.call_matcher(&p.grammar.clone())?;
            drop(m);
        }
        Ok(turn)
    }

    /// The calls closed since the last time (parsed; one that did not
    /// parse comes back as its text).
    pub(crate) fn take_closed(&mut self) -> Vec<Closed> {
        std::mem::take(&mut self.closed)
    }

    /// How many calls this turn made.
    pub(crate) fn n_calls(&self) -> usize {
        self.n_calls
    }

    /// Whether the turn computes masks (a constraint or tools): the
    /// session then computes them beside the forward pass.
    pub(crate) fn is_structured(&self) -> bool {
        self.answer.is_some() || self.tools.is_some()
    }

    pub(crate) fn think_header(&self) -> &'static str {
        self.think.as_ref().map_or("", |f| f.header)
    }

    fn call_matcher(&self, grammar: &str) -> Result<Matcher> {
        let g = self.grammars.as_ref().expect("tools need grammars");
        compile(g, TopLevelGrammar::from_lark(grammar.to_string()), "tools")
    }

    fn eog_set(&self) -> SimpleVob {
        let mut v = SimpleVob::alloc(self.n_vocab);
        for &t in &self.eog {
            v.allow_token(t);
        }
        v
    }

    fn singleton(&self, t: u32) -> SimpleVob {
        let mut v = SimpleVob::alloc(self.n_vocab);
        v.allow_token(t);
        v
    }

    /// Whether `mask` allows nothing but ending.
    fn only_eog(&self, mask: &SimpleVob) -> bool {
        only_eog(&self.eog, mask)
    }

    /// The mask of the next token.
    pub(crate) fn mask(&mut self, tok: &Tokenizer) -> Result<Mask> {
        if self.thinking {
            return Ok(Mask::Free);
        }
        if let Some(m) = self.call.as_mut() {
            let mask = if m.is_stopped() { None } else { Some(m.compute_mask().map_err(|e| engine_error("tools", e))?) };
            if mask.as_ref().is_none_or(|mask| self.only_eog(mask)) {
                self.close_call(tok);
                return self.mask(tok);
            }
            return Ok(Mask::Allowed(mask.expect("checked above")));
        }
        if self.after_call {
            let mut v = self.eog_set();
            if let Some(open) = self.tools.as_ref().and_then(|p| p.open) {
                v.allow_token(open);
            }
            return Ok(Mask::Allowed(v));
        }
        if let Some(p) = &self.tools {
            if p.forced {
                if let Some(open) = p.open {
                    return Ok(Mask::Allowed(self.singleton(open)));
                }
                // The JSON forms: the call is the answer, from its first token.
                let m = self.call_matcher(&p.grammar.clone())?;
                self.call = Some(m);
                return self.mask(tok);
            }
        }
        if self.answer_done {
            return Ok(Mask::Complete);
        }
        let open_think = self.think.as_ref().map(|f| f.open).filter(|_| !self.answer_started);
        match self.answer.as_mut() {
            None => Ok(Mask::Free),
            Some(m) => {
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
        }
    }

    /// JSON-form tools under `Auto`: the answer's first token opening with
    /// `{` starts a call; the caller samples again under the call's mask.
    pub(crate) fn opens_json_call(&mut self, token: u32, tok: &Tokenizer) -> Result<bool> {
        let Some(p) = &self.tools else { return Ok(false) };
        if self.thinking || self.answer_started || self.call.is_some() || p.open.is_some() || p.forced {
            return Ok(false);
        }
        let piece = tok.token_piece(token);
        let first = piece.iter().find(|b| !b.is_ascii_whitespace());
        if first != Some(&b'{') {
            return Ok(false);
        }
        let m = self.call_matcher(&p.grammar.clone())?;
        self.call = Some(m);
        Ok(true)
    }

    /// Take a sampled token.
    pub(crate) fn accept(&mut self, token: u32, tok: &Tokenizer) -> Result<Step> {
        let free = |channel| Ok(Step { channel, forced: Vec::new(), forced_channel: channel });
        if let Some(f) = self.think.clone() {
            if self.thinking {
                if token == f.close {
                    self.thinking = false;
                    return free(Channel::Marker);
                }
                self.think_tokens += 1;
                if self.budget.is_some_and(|b| self.think_tokens >= b) {
                    self.thinking = false;
                    let forced = tok.encode(f.close_text, false, true)?;
                    return Ok(Step { channel: Channel::Reasoning, forced, forced_channel: Channel::Marker });
                }
                return free(Channel::Reasoning);
            }
            if !self.answer_started && token == f.open && self.call.is_none() {
                self.thinking = true;
                if self.budget == Some(0) {
                    self.thinking = false;
                    let forced = tok.encode(f.close_text, false, true)?;
                    return Ok(Step { channel: Channel::Marker, forced, forced_channel: Channel::Marker });
                }
                return free(Channel::Marker);
            }
        }
        self.answer_started = true;
        if let Some(m) = self.call.as_mut() {
            m.consume_token(token).map_err(|e| engine_error("tools", e))?;
            self.call_tokens.push(token);
            let ff = m.consume_ff_tokens();
            self.call_tokens.extend_from_slice(&ff);
            return Ok(Step { channel: Channel::Call, forced: ff, forced_channel: Channel::Call });
        }
        if let Some(p) = &self.tools {
            if p.open == Some(token) {
                let m = self.call_matcher(&p.grammar.clone())?;
                self.call = Some(m);
                self.call_tokens.clear();
                self.call_tokens.push(token);
                return free(Channel::Marker);
            }
        }
        if let Some(m) = self.answer.as_mut() {
            m.consume_token(token).map_err(|e| engine_error("constraint", e))?;
            let ff = m.consume_ff_tokens();
            return Ok(Step { channel: Channel::Text, forced: ff, forced_channel: Channel::Text });
        }
        free(Channel::Text)
    }

    /// A call's grammar completed: parse it.
    fn close_call(&mut self, tok: &Tokenizer) {
        self.call = None;
        let toks = std::mem::take(&mut self.call_tokens);
        self.after_call = true;
        let Some(p) = &self.tools else { return };
        let text = String::from_utf8_lossy(&toks.iter().flat_map(|&t| tok.token_piece(t).to_vec()).collect::<Vec<u8>>())
            .into_owned();
        let (_, mut calls) = tools::parse_tool_calls(p.format, &text, &p.specs);
        if calls.len() == 1 {
            self.n_calls += 1;
            self.closed.push(Closed::Call(calls.remove(0)));
        } else {
            self.closed.push(Closed::Text(text));
        }
    }
}

/// A call that closed.
#[derive(Debug)]
pub(crate) enum Closed {
    Call(ParsedCall),
    /// Its text, when it did not parse (never expected under the grammar).
    Text(String),
}

fn only_eog(eog: &[u32], mask: &SimpleVob) -> bool {
    mask.num_set() == eog.iter().filter(|&&t| mask.is_allowed(t)).count()
}

fn engine_error(what: &str, e: impl std::fmt::Display) -> Error {
    Error::InvalidArgument(format!("{what}: {e}"))
}
