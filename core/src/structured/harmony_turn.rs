//! A turn in harmony (gpt-oss) as it is generated: each message's header
//! is read as it arrives and decides where its body goes (`analysis`:
//! thinking, `final` and preambles: the answer, `to=functions.NAME`: a
//! call). A structured turn (tools, or a constraint on the answer)
//! constrains every header by its grammar (`harmony::header_grammar`): the
//! messages it may write next, a call's name among the tools and its
//! arguments valid against the tool's schema; the `final` body is the
//! answer's constraint. Bodies are free text up to `<|end|>`.
//!
//! Markers are matched in the tokens' bytes, so a vocabulary that spells
//! them in text works as one that has them as tokens.

use std::sync::Arc;

use llguidance::toktrie::SimpleVob;
use llguidance::Matcher;

use super::harmony::{self, Allowed, Atoms, Header, BODY_ENDS, CALL, END, MAX_HEADER, MESSAGE};
use super::turn::{engine_error, find, only_eog, partial_suffix, take_forced, Channel, Closed, Mask, Step};
use super::{compile, Grammars, Reasoning, ToolSpec};
use crate::tokenizer::Tokenizer;
use crate::{Error, Result};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// A message's header (`after_end`: a message closed before it).
    Header {
        after_end: bool,
    },
    Body,
    /// A call's arguments, under the header's grammar.
    Call,
    /// A call closed, or the answer's end was written as text: only the end may follow.
    Done,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Route {
    Reasoning,
    Text,
    /// The `final` body under the request's constraint.
    Answer,
}

pub(crate) struct HarmonyTurn {
    grammars: Option<Arc<Grammars>>,
    atoms: Atoms,
    /// The tools the turn may call (none: no calls).
    tools: Vec<ToolSpec>,
    /// A call is owed (`Required`, `Named`).
    forced: bool,
    reasoning: Reasoning,
    answer: Option<Matcher>,
    answer_done: bool,
    think_tokens: usize,
    state: State,
    route: Route,
    /// The message so far: its header, and a call's arguments.
    header: Vec<u8>,
    /// The header's grammar (structured turns), on to a call's end.
    matcher: Option<Matcher>,
    /// Body bytes that may begin a closing marker.
    held: Vec<u8>,
    body_started: bool,
    /// Bodies written per channel (a blank line between two).
    bodies: [usize; 2],
    closed: Vec<Closed>,
    n_calls: usize,
    eog: Vec<u32>,
    call_id: Option<u32>,
    end_tokens: Vec<u32>,
    n_vocab: usize,
}

impl HarmonyTurn {
    /// A turn after `prompt_text` (which ends with `<|start|>assistant`, an
    /// open analysis message, or a closed one). `tools`: the callable
    /// tools, `forced` when a call is owed.
    pub(crate) fn new(
        tok: &Tokenizer,
        grammars: Option<Arc<Grammars>>,
        reasoning: Reasoning,
        prompt_text: &str,
        answer: Option<Matcher>,
        tools: Vec<ToolSpec>,
        forced: bool,
    ) -> Result<HarmonyTurn> {
        if (!tools.is_empty() || answer.is_some()) && grammars.is_none() {
            return Err(Error::InvalidArgument("tools: no constraint engine for this vocabulary".into()));
        }
        let single = |t: &str| tok.token_id(t).filter(|&id| tok.token_piece(id) == t.as_bytes());
        let trimmed = prompt_text.trim_end();
        let open_thought = trimmed.rfind("<|channel|>analysis<|message|>").is_some_and(|i| !trimmed[i..].contains(END));
        let mut turn = HarmonyTurn {
            grammars,
            atoms: Atoms::of(tok),
            tools,
            forced,
            reasoning,
            answer,
            answer_done: false,
            think_tokens: 0,
            state: State::Body,
            route: Route::Reasoning,
            header: Vec::new(),
            matcher: None,
            held: Vec::new(),
            body_started: false,
            bodies: [0; 2],
            closed: Vec::new(),
            n_calls: 0,
            eog: tok.end_of_generation_tokens().collect(),
            call_id: single(CALL),
            end_tokens: tok.encode(END, false, true)?,
            n_vocab: tok.n_vocab(),
        };
        if turn.structured() {
            // A bad tool is an error before any token.
            turn.header_matcher(false)?;
        }
        if !open_thought {
            turn.enter_header(trimmed.ends_with(END))?;
        }
        Ok(turn)
    }

    /// Whether the turn computes masks (tools, or a constrained answer).
    pub(crate) fn structured(&self) -> bool {
        !self.tools.is_empty() || self.answer.is_some()
    }

    pub(crate) fn take_closed(&mut self) -> Vec<Closed> {
        std::mem::take(&mut self.closed)
    }

    pub(crate) fn n_calls(&self) -> usize {
        self.n_calls
    }

    fn budget_left(&self) -> bool {
        match self.reasoning {
            Reasoning::Off => false,
            Reasoning::Budget(n) => self.think_tokens < n as usize,
            Reasoning::Default | Reasoning::On => true,
        }
    }

    /// The grammar of the next header: thinking while its budget lasts,
    /// preambles and the answer unless a call is owed, and the calls.
    fn header_matcher(&self, after_end: bool) -> Result<Matcher> {
        let g = self.grammars.as_ref().ok_or_else(|| Error::InvalidArgument("tools: no constraint engine".into()))?;
        let allowed = Allowed {
            after_end,
            analysis: self.budget_left(),
            preamble: !self.forced && self.answer.is_none(),
            final_: !self.forced,
        };
        let tools: Vec<&ToolSpec> = self.tools.iter().collect();
        let lark = harmony::header_grammar(&tools, &self.atoms, allowed)?;
        compile(g, llguidance::api::TopLevelGrammar::from_lark(lark), "tools")
    }

    fn enter_header(&mut self, after_end: bool) -> Result<()> {
        self.state = State::Header { after_end };
        self.header.clear();
        self.body_started = false;
        self.matcher = if self.structured() { Some(self.header_matcher(after_end)?) } else { None };
        Ok(())
    }

    /// The mask of the next token.
    pub(crate) fn mask(&mut self) -> Result<Mask> {
        match self.state {
            State::Done => {
                let mut v = SimpleVob::alloc(self.n_vocab);
                match self.call_id.filter(|_| self.n_calls > 0) {
                    Some(call) => v.allow_token(call),
                    None => self.eog.iter().for_each(|&t| v.allow_token(t)),
                }
                Ok(Mask::Allowed(v))
            }
            State::Header { .. } | State::Call => {
                let Some(m) = self.matcher.as_mut() else { return Ok(Mask::Free) };
                let mask =
                    if m.is_stopped() { None } else { Some(m.compute_mask().map_err(|e| engine_error("tools", e))?) };
                match mask {
                    Some(mask) if !only_eog(&self.eog, &mask) => Ok(Mask::Allowed(mask)),
                    _ if self.state == State::Call => {
                        self.close_call();
                        self.mask()
                    }
                    _ => Err(Error::InvalidArgument("tools: no token can continue the message's header".into())),
                }
            }
            State::Body if self.route == Route::Answer => {
                let Some(m) = self.answer.as_mut().filter(|_| !self.answer_done) else { return Ok(Mask::Complete) };
                if m.is_stopped() {
                    self.answer_done = true;
                    return Ok(Mask::Complete);
                }
                let mask = m.compute_mask().map_err(|e| engine_error("constraint", e))?;
                if only_eog(&self.eog, &mask) && m.is_accepting().unwrap_or(false) {
                    self.answer_done = true;
                    return Ok(Mask::Complete);
                }
                if mask.is_zero() {
                    return Err(Error::InvalidArgument("constraint: no token can continue the answer".into()));
                }
                Ok(Mask::Allowed(mask))
            }
            State::Body => Ok(Mask::Free),
        }
    }

    /// The model would end inside a thought or a preamble while a call or
    /// the constrained answer is owed: the message closes instead and the
    /// next header follows.
    pub(crate) fn close_instead_of_ending(&mut self) -> Result<Option<Step>> {
        let owes = self.forced || self.answer.is_some();
        if !(owes && self.state == State::Body && self.route != Route::Answer) {
            return Ok(None);
        }
        let mut step = Step::default();
        self.close_body(&mut step)?;
        Ok(Some(step))
    }

    /// Close the current body with `<|end|>` (forced) and open the next header.
    fn close_body(&mut self, step: &mut Step) -> Result<()> {
        let held = std::mem::take(&mut self.held);
        self.emit(&held, step);
        step.forced = self.end_tokens.clone();
        self.enter_header(true)
    }

    /// Take a sampled token.
    pub(crate) fn accept(&mut self, token: u32, tok: &Tokenizer) -> Result<Step> {
        let mut step = Step::default();
        let mut bytes = tok.token_piece(token).to_vec();
        match self.state {
            State::Done => {}
            State::Header { .. } | State::Call => {
                if let Some(m) = self.matcher.as_mut() {
                    m.consume_token(token).map_err(|e| engine_error("tools", e))?;
                    step.forced = take_forced(m);
                    step.forced.iter().for_each(|&t| bytes.extend_from_slice(tok.token_piece(t)));
                }
                if self.state == State::Call {
                    self.header.extend_from_slice(&bytes);
                } else {
                    self.header_bytes(&bytes, &mut step)?;
                }
            }
            State::Body if self.route == Route::Answer => {
                if let Some(m) = self.answer.as_mut() {
                    m.consume_token(token).map_err(|e| engine_error("constraint", e))?;
                    step.forced = take_forced(m);
                    step.forced.iter().for_each(|&t| bytes.extend_from_slice(tok.token_piece(t)));
                }
                step.push(Channel::Text, &bytes);
            }
            State::Body => {
                if self.route == Route::Reasoning {
                    self.think_tokens += 1;
                }
                self.body_bytes(&bytes, &mut step)?;
                if self.state == State::Body && self.route == Route::Reasoning && !self.budget_left() {
                    self.close_body(&mut step)?;
                }
            }
        }
        Ok(step)
    }

    /// Header bytes: at `<|message|>` the header is read and the body begins.
    fn header_bytes(&mut self, bytes: &[u8], step: &mut Step) -> Result<()> {
        self.header.extend_from_slice(bytes);
        let Some(at) = find(&self.header, MESSAGE.as_bytes()) else {
            if self.matcher.is_none() && self.header.len() > MAX_HEADER {
                // Not harmony after all: the text is the answer's.
                self.start_body(Route::Text);
                let header = std::mem::take(&mut self.header);
                self.body_bytes(&header, step)?;
            }
            return Ok(());
        };
        let header = Header::parse(&String::from_utf8_lossy(&self.header[..at]));
        let rest = self.header.split_off(at + MESSAGE.len());
        match header {
            Some(h) if h.recipient.is_some() && self.matcher.is_some() => {
                // A call: its arguments go on under the header's grammar.
                self.header.extend_from_slice(&rest);
                self.state = State::Call;
                return Ok(());
            }
            Some(h) if h.recipient.is_none() => {
                self.matcher = None;
                let route = match h.channel.as_str() {
                    "analysis" => Route::Reasoning,
                    "final" if self.answer.is_some() => Route::Answer,
                    _ => Route::Text,
                };
                self.start_body(route);
                if route == Route::Answer {
                    // A token past `<|message|>` (markers spelled in text) was the header grammar's end.
                    return Ok(());
                }
            }
            _ => {
                // Unsolicited calls and what does not read as a header: text, kept whole.
                self.matcher = None;
                self.start_body(Route::Text);
                let header = std::mem::take(&mut self.header);
                self.emit(&header, step);
            }
        }
        self.header.clear();
        self.body_bytes(&rest, step)
    }

    fn start_body(&mut self, route: Route) {
        self.state = State::Body;
        self.route = route;
        self.body_started = false;
    }

    /// Body bytes, up to a closing marker.
    fn body_bytes(&mut self, bytes: &[u8], step: &mut Step) -> Result<()> {
        self.held.extend_from_slice(bytes);
        let hit = BODY_ENDS.iter().filter_map(|m| find(&self.held, m.as_bytes()).map(|at| (at, *m))).min();
        let Some((at, marker)) = hit else {
            let keep = BODY_ENDS.iter().map(|m| partial_suffix(&self.held, m.as_bytes())).max().unwrap_or(0);
            let release: Vec<u8> = self.held.drain(..self.held.len() - keep).collect();
            self.emit(&release, step);
            return Ok(());
        };
        let held = std::mem::take(&mut self.held);
        self.emit(&held[..at], step);
        if marker != END {
            // The end written as text (a vocabulary without the token).
            self.state = State::Done;
            return Ok(());
        }
        self.enter_header(true)?;
        let rest = &held[at + marker.len()..];
        if rest.is_empty() {
            return Ok(());
        }
        if let Some(m) = self.matcher.as_mut() {
            // The rest of the token as tokens of the header's grammar.
            let env = m.tok_env().map_err(|e| engine_error("tools", e))?;
            let ids = env.tokenize_bytes(rest);
            if m.validate_tokens(&ids).ok() != Some(ids.len()) || m.consume_tokens(&ids).is_err() {
                return Ok(());
            }
        }
        self.header_bytes(rest, step)
    }

    /// Body text to its channel (a blank line before a channel's second body).
    fn emit(&mut self, bytes: &[u8], step: &mut Step) {
        if bytes.is_empty() {
            return;
        }
        let (channel, i) = match self.route {
            Route::Reasoning => (Channel::Reasoning, 0),
            Route::Text | Route::Answer => (Channel::Text, 1),
        };
        if !self.body_started {
            self.body_started = true;
            if self.bodies[i] > 0 {
                step.push(channel, b"\n\n");
            }
            self.bodies[i] += 1;
        }
        step.push(channel, bytes);
    }

    /// A call's grammar completed: parse the message.
    fn close_call(&mut self) {
        self.matcher = None;
        self.state = State::Done;
        let text = String::from_utf8_lossy(&std::mem::take(&mut self.header)).into_owned();
        let mut out = harmony::parse_harmony(&text);
        if out.calls.len() == 1 {
            self.n_calls += 1;
            self.closed.push(Closed::Call(out.calls.remove(0)));
        } else {
            self.closed.push(Closed::Text(text));
        }
    }

    /// Text still held back at the end: a body's tail; a header that never
    /// read as one (a model that does not write harmony) is the answer's text.
    pub(crate) fn finish(&mut self) -> Step {
        let mut step = Step::default();
        let held = std::mem::take(&mut self.held);
        self.emit(&held, &mut step);
        if matches!(self.state, State::Header { .. }) && self.matcher.is_none() {
            let text = String::from_utf8_lossy(&self.header).into_owned();
            let t = text.trim_start();
            let t = t.strip_prefix(harmony::START).unwrap_or(t).trim_start_matches("assistant");
            if !(t.is_empty() || t.starts_with("<|") || t.starts_with(" to=")) {
                self.route = Route::Text;
                self.body_started = false;
                let header = std::mem::take(&mut self.header);
                self.emit(&header, &mut step);
            }
        }
        step
    }
}

#[cfg(test)]
#[path = "harmony_turn_tests.rs"]
mod tests;
