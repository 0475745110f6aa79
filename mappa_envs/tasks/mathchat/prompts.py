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


def worked_example(problem: str, solution: str, wrong: str, code: str, printed: str) -> dict[str, tuple]:
    """Per role, one worked example as (user message, assistant reply) turns: the solver's ``solution`` line (its
    answer boxed), the code executor's ``code`` shown after a solver's ``wrong`` line (the example teaches to
    compute, not to copy), the verifier trusting the code's ``printed`` number over that wrong line."""
    task, wrong_work = f"## Task\n{problem}", f"## Work of the earlier agents\n### Problem solver\n{wrong}"
    verifier_reply = f"The code printed {printed}, so the answer is \\boxed{{{printed}}}."
    return {
        "problem_solver": ((_example_input(task, f"## Your job\n{SMALL_PROBLEM_SOLVER_INSTRUCTION}"), solution),),
        "code_executor": ((_example_input(task, wrong_work, f"## Your job\n{SMALL_CODE_EXECUTOR_INSTRUCTION}"), code),),
        "verifier": (
            (
                _example_input(
                    task,
                    f"{wrong_work}\n### Code executor (turn 1)\n{code}\n"
                    "### Result of running the code executor's code\n"
                    f"Execution status: ok (exit code 0)\nstdout:\n{printed}",
                    f"## Your job\n{SMALL_VERIFIER_INSTRUCTION}",
                ),
                verifier_reply,
            ),
        ),
    }


SMALL_EXAMPLES = worked_example(
    SMALL_EXAMPLE_PROBLEM,
    SMALL_SOLVER_REPLY,
    "The farm has 37 + 43 = 80 cows. \\boxed{80}",
    SMALL_CODE_REPLY,
    "82",
)
"""Per role, its worked example as (user message, assistant reply) turns (``Role.examples``)."""


# ------------------------------------------------------------------------------------------ small-balanced style
# `prompt_style="small-balanced"` (the arith2 splits, mappa-bench-v2): the small style's instructions, and a worked
# example chosen per task from one per operation (one-step problems) or four two-step ones covering every operation
# twice; the task's metadata["example"] picks it (mappa_envs.tasks.mathchat.arith2 balances the choice across each
# operation). Every example's numbers, answers included, lie outside the operand range 2-20.
BALANCED_ONE_STEP = tuple(
    worked_example(problem, f"{calc}. \\boxed{{{answer}}}", f"{wrong}. \\boxed{{{wrong_answer}}}", code, answer)
    for problem, calc, wrong, wrong_answer, code, answer in (
        (
            SMALL_EXAMPLE_PROBLEM,
            "The farm has 37 + 45 = 82 cows",
            "The farm has 37 + 43 = 80 cows",
            "80",
            SMALL_CODE_REPLY,
            "82",
        ),
        (
            "A library has 93 books and lends out 28. How many books are still in the library?",
            "The library has 93 - 28 = 65 books left",
            "The library has 93 - 26 = 67 books left",
            "67",
            "```python\nbooks = 93\nlent = 28\nprint(books - lent)\n```",
            "65",
        ),
        (
            "A bakery fills 23 trays with 31 rolls on each tray. How many rolls are there?",
            "There are 23 * 31 = 713 rolls",
            "There are 23 * 31 = 693 rolls",
            "693",
            "```python\ntrays = 23\nrolls_per_tray = 31\nprint(trays * rolls_per_tray)\n```",
            "713",
        ),
        (
            "A school splits 966 pupils into 23 equal teams. How many pupils are in each team?",
            "Each team has 966 / 23 = 42 pupils",
            "Each team has 966 / 23 = 41 pupils",
            "41",
            "```python\npupils = 966\nteams = 23\nprint(pupils // teams)\n```",
            "42",
        ),
    )
)
"""The one-step examples: addition, subtraction, multiplication, division (``metadata["example"]`` 0-3)."""
BALANCED_TWO_STEP = tuple(
    worked_example(problem, f"{calc}. \\boxed{{{answer}}}", f"{wrong}. \\boxed{{{wrong_answer}}}", code, answer)
    for problem, calc, wrong, wrong_answer, code, answer in (
        (
            "Each box holds 24 red pens and 33 blue pens. How many pens are in 25 boxes?",
            "There are (24 + 33) * 25 = 1425 pens",
            "There are 24 + 33 * 25 = 849 pens",
            "849",
            "```python\nred = 24\nblue = 33\nboxes = 25\nprint((red + blue) * boxes)\n```",
            "1425",
        ),
        (
            "A farmer has 26 crates with 35 eggs in each crate and sells 97 eggs. How many eggs are left?",
            "The farmer has 26 * 35 - 97 = 813 eggs left",
            "The farmer has 26 * 35 - 97 = 823 eggs left",
            "823",
            "```python\ncrates = 26\neggs_per_crate = 35\nsold = 97\nprint(crates * eggs_per_crate - sold)\n```",
            "813",
        ),
        (
            "A club has 1000 tickets, gives away 55, and splits the rest equally among 21 members. "
            "How many tickets does each member get?",
            "Each member gets (1000 - 55) / 21 = 45 tickets",
            "Each member gets (1000 - 55) / 21 = 47 tickets",
            "47",
            "```python\ntickets = 1000\ngiven = 55\nmembers = 21\nprint((tickets - given) // members)\n```",
            "45",
        ),
        (
            "A baker shares 868 cookies equally among 28 boxes and then adds 39 cookies to one box. "
            "How many cookies are in that box?",
            "That box has 868 / 28 + 39 = 70 cookies",
            "That box has 868 / 28 + 39 = 68 cookies",
            "68",
            "```python\ncookies = 868\nboxes = 28\nadded = 39\nprint(cookies // boxes + added)\n```",
            "70",
        ),
    )
)
"""The two-step examples: add then multiply, multiply then subtract, subtract then divide, divide then add."""

STYLES = ("paper", "small", "small-balanced")
"""``prompt_style`` values of MathChat: the paper's prompts (the default, for AIME/AMC), the small-model style (one
worked example, an addition), or the small-model style with a worked example per task that favours no operation."""
