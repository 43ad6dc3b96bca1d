//! bench-recall's optional QA mode (needs `[llm]`): the LLM answers each
//! question from the memories retrieved for it, then judges the answer against
//! the reference with criteria per question type that follow the official
//! LongMemEval evaluation: the answer must contain the reference (or all the
//! steps to it); temporal questions forgive off-by-one day counts; knowledge
//! updates may mention the old value if the updated one is given; preference
//! questions are judged against a rubric; abstention questions must be
//! recognised as unanswerable.

use serde::Serialize;

use super::Question;
use crate::providers::llm::{Llm, LlmError};

/// Memories put in front of the answering model.
pub const CONTEXT_MEMORIES: usize = 10;

const ANSWER_PROMPT: &str = "You are a personal assistant with a long-term memory. Answer the \
user's question using only the memories listed (each with the date it was recorded). Be brief. \
If the memories do not contain the answer, say that you don't know. Return JSON \
{\"answer\": \"…\"}.";

const JUDGE_PROMPT: &str = "You grade answers of a memory assistant. Return JSON \
{\"correct\": true|false} and nothing else.";

#[derive(Debug, Clone, Serialize)]
pub struct QaResult {
    pub answer: String,
    pub correct: bool,
}

fn judge_instructions(q: &Question) -> String {
    let base = "Say correct if the response contains the correct answer, or is equivalent to it, \
or contains all the intermediate steps needed to reach it. If it gives only part of the \
information the answer requires, it is not correct.";
    let (criteria, label) = if q.abstention {
        (
            "The question cannot be answered from the user's history. Say correct if the \
response recognises this: it may say the information is missing or incomplete, or that \
related information exists but not what was asked."
                .to_string(),
            "Explanation",
        )
    } else {
        match q.question_type.as_str() {
            "single-session-preference" => (
                "The rubric describes a personalised response. Say correct if the response \
recalls and uses the user's personal information as the rubric says; it need not cover every \
point of the rubric."
                    .to_string(),
                "Rubric",
            ),
            "temporal-reasoning" => (
                format!(
                    "{base} Do not penalise off-by-one errors in counts of days, weeks or months \
(e.g. 19 days when the answer is 18)."
                ),
                "Correct answer",
            ),
            "knowledge-update" => (
                format!(
                    "{base} A response that also mentions earlier information is correct as \
long as its updated answer is the correct one."
                ),
                "Correct answer",
            ),
            _ => (base.to_string(), "Correct answer"),
        }
    };
    format!(
        "{criteria}\n\nQuestion: {}\n\n{label}: {}\n\n",
        q.question, q.answer
    )
}

/// Answer `q` from `memories` (text, recorded at) and judge the answer.
pub async fn answer_and_judge(
    llm: &Llm,
    stream: &str,
    q: &Question,
    memories: &[(String, String)],
) -> Result<QaResult, LlmError> {
    let mut prompt = format!(
        "Today is {}.\n\nMemories:\n",
        crate::core::time::to_rfc3339(q.question_date)
    );
    for (i, (text, at)) in memories.iter().take(CONTEXT_MEMORIES).enumerate() {
        prompt.push_str(&format!("[{}] ({at}) {text}\n", i + 1));
    }
    prompt.push_str(&format!("\nQuestion: {}", q.question));
    let answered = llm
        .chat_json(
            stream,
            "bench_answer",
            ANSWER_PROMPT,
            &prompt,
            "bench_answer",
            serde_json::json!({
                "type": "object", "additionalProperties": false, "required": ["answer"],
                "properties": {"answer": {"type": "string"}},
            }),
        )
        .await?;
    let answer = answered.json["answer"]
        .as_str()
        .ok_or_else(|| LlmError::Answer("no `answer` string".into()))?
        .to_string();
    let judged = llm
        .chat_json(
            stream,
            "bench_judge",
            JUDGE_PROMPT,
            &format!("{}Model response: {answer}", judge_instructions(q)),
            "bench_judgement",
            serde_json::json!({
                "type": "object", "additionalProperties": false, "required": ["correct"],
                "properties": {"correct": {"type": "boolean"}},
            }),
        )
        .await?;
    let correct = judged.json["correct"]
        .as_bool()
        .ok_or_else(|| LlmError::Answer("no `correct` boolean".into()))?;
    Ok(QaResult { answer, correct })
}
