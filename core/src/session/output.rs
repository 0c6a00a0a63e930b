//! What a request streams: answer text through the stop strings, thinking
//! apart, both decoded token by token; and the helpers the generate loop
//! shares (the answer's plan, sampling under a mask).

use llguidance::toktrie::SimpleVob;

use super::cancel::Ticket;
use super::options::{GenerateOptions, GenerationStats, StopReason};
use super::stop::StopMatcher;
use crate::sampler::Sampler;
use crate::structured::{Channel, GenerationEvent, Mask, Reasoning, ThinkFormat, ToolChoice, ToolFormat, ToolSpec};
use crate::tokenizer::{StreamDecoder, Tokenizer};
use crate::{Error, Result};

/// How a request's answer is structured beyond its constraint: the
/// model's thinking format and the tools offered.
#[derive(Clone, Debug, Default)]
pub struct Plan {
    pub think: Option<ThinkFormat>,
    pub tools: Option<(ToolFormat, Vec<ToolSpec>, ToolChoice)>,
    /// The prompt's text (whether it leaves a thought open).
    pub prompt: String,
}

/// Thinking asked of a model without a thinking format is refused, not ignored.
pub(super) fn check_reasoning(r: Reasoning, think: Option<&ThinkFormat>) -> Result<()> {
    match (r, think) {
        (Reasoning::On | Reasoning::Budget(_), None) => Err(Error::InvalidArgument(
            "reasoning: this model's template has no thinking format (on and budgets need one)".into(),
        )),
        _ => Ok(()),
    }
}

/// An event listener from a text listener: answer text only.
pub(super) fn text_only<'a>(on_piece: &'a mut dyn FnMut(&str) -> bool) -> impl FnMut(GenerationEvent) -> bool + 'a {
    move |e| match e {
        GenerationEvent::Text(t) => on_piece(&t),
        _ => true,
    }
}

/// Sample from `logits` with the tokens `mask` forbids at minus infinity.
pub(super) fn sample_under(sampler: &mut Sampler, logits: &[f32], mask: &Mask, buf: &mut Vec<f32>) -> u32 {
    match mask {
        Mask::Allowed(allowed) => {
            buf.clear();
            buf.extend_from_slice(logits);
            forbid(allowed, buf);
            sampler.sample(buf)
        }
        _ => sampler.sample(logits),
    }
}

fn forbid(allowed: &SimpleVob, logits: &mut [f32]) {
    let n = allowed.len().min(logits.len());
    for (i, l) in logits.iter_mut().enumerate().take(n) {
        if !allowed.is_allowed(i as u32) {
            *l = f32::NEG_INFINITY;
        }
    }
    // Output rows past the vocabulary (padding) are never allowed.
    logits[n..].iter_mut().for_each(|l| *l = f32::NEG_INFINITY);
}

/// The streams of one request.
pub(super) struct Output<'t> {
    text: StreamDecoder<'t>,
    thought: StreamDecoder<'t>,
    stops: StopMatcher<'t>,
    /// The thought's header not yet seen (Gemma 4's channel name).
    header: &'static str,
    header_seen: usize,
    /// A thought was seen: the answer's leading newlines are dropped.
    after_thought: bool,
    text_started: bool,
    pub stopped: Option<StopReason>,
}

impl<'t> Output<'t> {
    pub fn new(tok: &'t Tokenizer, opts: &'t GenerateOptions, header: &'static str) -> Output<'t> {
        Output {
            text: tok.stream_decoder(opts.show_special),
            thought: tok.stream_decoder(opts.show_special),
            stops: StopMatcher::new(&opts.stop),
            header,
            header_seen: 0,
            after_thought: false,
            text_started: false,
            stopped: None,
        }
    }

    /// Send `event` unless cancelled; false (and `stopped` set) when the request must end.
    pub fn emit(
        &mut self,
        ticket: &Ticket,
        stats: &mut GenerationStats,
        on_event: &mut dyn FnMut(GenerationEvent) -> bool,
        event: GenerationEvent,
    ) -> bool {
        let _ = stats;
        // Nothing reaches the listener after a cancel.
        if ticket.cancelled() {
            self.stopped = Some(StopReason::Cancelled);
            return false;
        }
        if !on_event(event) {
            // A listener that stops because the caller cancelled reports the cancel.
            self.stopped = Some(if ticket.cancelled() { StopReason::Cancelled } else { StopReason::ListenerStopped });
            return false;
        }
        true
    }

    /// Stream text a token released to its channels.
    pub fn route(
        &mut self,
        ticket: &Ticket,
        stats: &mut GenerationStats,
        on_event: &mut dyn FnMut(GenerationEvent) -> bool,
        segments: &[(Channel, Vec<u8>)],
    ) {
        for (channel, bytes) in segments {
            if self.stopped.is_some() {
                return;
            }
            match channel {
                Channel::Reasoning => {
                    self.after_thought = true;
                    let mut piece = self.thought.push_bytes(bytes);
                    if self.header_seen < self.header.len() {
                        // Drop the header as it arrives (it may span tokens).
                        let want = &self.header[self.header_seen..];
                        let common = piece.bytes().zip(want.bytes()).take_while(|(a, b)| a == b).count();
                        if common == piece.len() || common == want.len() {
                            self.header_seen += common;
                            piece.drain(..common);
                        } else {
                            self.header_seen = self.header.len();
                        }
                    }
                    if !piece.is_empty() {
                        stats.reasoning.push_str(&piece);
                        self.emit(ticket, stats, on_event, GenerationEvent::Reasoning(piece));
                    }
                }
                Channel::Text => {
                    let mut piece = self.text.push_bytes(bytes);
                    if self.after_thought && stats.text.is_empty() && !self.text_started {
                        piece = piece.trim_start_matches(['\n', '\r']).to_string();
                    }
                    self.text_started |= !piece.is_empty();
                    let (emit, hit) = self.stops.push(&piece);
                    if !emit.is_empty() {
                        stats.text.push_str(&emit);
                        self.emit(ticket, stats, on_event, GenerationEvent::Text(emit));
                    }
                    if hit && self.stopped.is_none() {
                        self.stopped = Some(StopReason::StopString);
                    }
                }
            }
        }
    }

    /// Release what the decoders and the stop matcher hold back.
    pub fn flush(&mut self, stats: &mut GenerationStats, on_event: &mut dyn FnMut(GenerationEvent) -> bool) {
        let thought = self.thought.flush();
        if !thought.is_empty() {
            stats.reasoning.push_str(&thought);
            on_event(GenerationEvent::Reasoning(thought));
        }
        let mut rest = self.stops.finish();
        rest.push_str(&self.text.flush());
        if !rest.is_empty() {
            stats.text.push_str(&rest);
            on_event(GenerationEvent::Text(rest));
        }
    }
}
