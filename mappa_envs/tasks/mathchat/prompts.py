"""MathChat role prompts (problem solver -> code executor -> verifier)."""

TEAM = (
    "You are part of a team of three agents solving competition math problems: a problem solver, a code "
    "executor and a verifier. Each agent sees the problem and the work of the agents before it."
)

PROBLEM_SOLVER_SYSTEM = (
    f"{TEAM} You are the problem solver: reason step by step, clearly and concisely, and state your answer "
    "as \\boxed{answer}."
)
PROBLEM_SOLVER_INSTRUCTION = "Solve the problem step by step. End with your answer as \\boxed{answer}."

CODE_EXECUTOR_SYSTEM = f"""{TEAM} You are the code executor: you check the solution by computing the answer \
with Python. Write one ```python code block that computes the answer and prints it. The code is run and you see \
its output; if it fails, fix it in your next reply.

Example.
Problem: A box holds 12 pencils. How many pencils are in 7 boxes?
Your reply:
```python
pencils_per_box = 12
boxes = 7
print(pencils_per_box * boxes)
```"""
CODE_EXECUTOR_INSTRUCTION = "Write one ```python code block that computes the answer to the task and prints it."
CODE_EXECUTOR_CONTINUE = (
    "That is the output of your code. If it failed or looks wrong, write a corrected ```python block; "
    "otherwise state the computed answer in one sentence, without code."
)

VERIFIER_SYSTEM = (
    f"{TEAM} You are the verifier: you check the problem solver's reasoning against the code executor's "
    "result and give the team's final answer as \\boxed{answer}."
)
VERIFIER_INSTRUCTION = (
    "Check the work above. If the reasoning and the code's output disagree, decide which is right. "
    "Give the final answer as \\boxed{answer}."
)

# ------------------------------------------------------------------------------------------ small-model style
# `prompt_style="small"`: short instructions and one worked example per role, shown as an earlier chat turn
# (`Role.examples`), for models that follow a format only when shown one (SmolLM2-135M; a pilot with the examples
# inside the system prompt: 0/64 on arith1-dev, the solver rarely boxed an answer). The examples' numbers (37, 45,
# 82, 80) lie outside the one-operation pool (operands 2-20, mappa_envs.tasks.mathchat.data.ONE_OPERATION_RANGE):
# an answer copied from an example is wrong, and the rule-based coach gives code or answers copied from an example
# no credit. No placeholder such as "\boxed{answer}" appears anywhere: small models copy placeholders literally.
SMALL_EXAMPLE_PROBLEM = "A farm has 37 cows and buys 45 more. How many cows does the farm have now?"
SMALL_EXAMPLE_NUMBERS = ("37", "45", "82", "80")
"""Every number the small-style examples show (a coach treats them as the examples', not the task's)."""

SMALL_PROBLEM_SOLVER_SYSTEM = (
    "You solve short math word problems. Write the calculation in one line, then the answer in \\boxed{}."
)
SMALL_PROBLEM_SOLVER_INSTRUCTION = "Solve the problem: one line of calculation, then the answer in \\boxed{}."
SMALL_SOLVER_REPLY = "The farm has 37 + 45 = 82 cows. \\boxed{82}"

SMALL_CODE_EXECUTOR_SYSTEM = (
    "You check a math word problem with Python. Write one short ```python block that computes the answer from the "
    "problem's numbers and prints it. The code is run and you see its output."
)
SMALL_CODE_EXECUTOR_INSTRUCTION = (
    "Write one ```python block that computes the answer from the problem's numbers and prints it."
)
SMALL_CODE_REPLY = "```python\ncows = 37\nbought = 45\nprint(cows + bought)\n```"
SMALL_CODE_EXECUTOR_CONTINUE = (
    "That is your code's output. If it failed, write a corrected ```python block; otherwise say in one sentence "
    "what number it printed."
)

SMALL_VERIFIER_SYSTEM = (
    "You give the team's final answer to a math word problem. Compare the solver's answer with the number the code "
    "printed; when they differ, trust the code. Reply in one sentence ending with the answer in \\boxed{}."
)
SMALL_VERIFIER_INSTRUCTION = "Give the final answer in one sentence, ending with \\boxed{}."
SMALL_VERIFIER_REPLY = "The code printed 82, so the answer is \\boxed{82}."


def _example_input(*parts: str) -> str:
    """An example's user message, laid out as the pipeline lays out a real one (mappa_envs.core.PipelineEnv)."""
    return "\n\n".join(parts)


SMALL_EXAMPLES = {
    "problem_solver": (
        (
            _example_input(f"## Task\n{SMALL_EXAMPLE_PROBLEM}", f"## Your job\n{SMALL_PROBLEM_SOLVER_INSTRUCTION}"),
            SMALL_SOLVER_REPLY,
        ),
    ),
    "code_executor": (
        (
            _example_input(
                f"## Task\n{SMALL_EXAMPLE_PROBLEM}",
                "## Work of the earlier agents\n### Problem solver\nThe farm has 37 + 43 = 80 cows. \\boxed{80}",
                f"## Your job\n{SMALL_CODE_EXECUTOR_INSTRUCTION}",
            ),
            SMALL_CODE_REPLY,
        ),
    ),
    "verifier": (
        (
            _example_input(
                f"## Task\n{SMALL_EXAMPLE_PROBLEM}",
                "## Work of the earlier agents\n### Problem solver\nThe farm has 37 + 43 = 80 cows. \\boxed{80}\n"
                f"### Code executor (turn 1)\n{SMALL_CODE_REPLY}\n### Result of running the code executor's code\n"
                "Execution status: ok (exit code 0)\nstdout:\n82",
                f"## Your job\n{SMALL_VERIFIER_INSTRUCTION}",
            ),
            SMALL_VERIFIER_REPLY,
        ),
    ),
}
"""Per role, its worked example as (user message, assistant reply) turns (``Role.examples``)."""

STYLES = ("paper", "small")
"""``prompt_style`` values of MathChat: the paper's prompts (the default, for AIME/AMC) or the small-model style."""
