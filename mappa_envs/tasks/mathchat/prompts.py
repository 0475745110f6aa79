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
# `prompt_style="small"`: short instructions and one worked example per role, for models that follow a format only
# when shown one (SmolLM2-135M: ../docs). The examples' numbers (37, 45, 82, 80) lie outside the one-operation pool
# (operands 2-20, mappa_envs.tasks.mathchat.data.ONE_OPERATION_RANGE): an answer copied from an example is wrong,
# and the rule-based coach gives code or answers copied from an example no credit. No placeholder such as
# "\boxed{answer}" appears anywhere: small models copy placeholders literally.
SMALL_EXAMPLE_PROBLEM = "A farm has 37 cows and buys 45 more. How many cows does the farm have now?"
SMALL_EXAMPLE_NUMBERS = ("37", "45", "82", "80")
"""Every number the small-style examples show (a coach treats them as the examples', not the task's)."""

SMALL_PROBLEM_SOLVER_SYSTEM = f"""You solve short math word problems. Write the calculation in one line, then the \
answer in \\boxed{{}}.

Example.
Problem: {SMALL_EXAMPLE_PROBLEM}
Reply: The farm has 37 + 45 = 82 cows. \\boxed{{82}}"""
SMALL_PROBLEM_SOLVER_INSTRUCTION = "Solve the problem above as in the example: one line of calculation, then \\boxed{}."

SMALL_CODE_EXECUTOR_SYSTEM = f"""You check a math word problem with Python. Write one short ```python block that \
computes the answer from the problem's numbers and prints it. The code is run and you see its output.

Example.
Problem: {SMALL_EXAMPLE_PROBLEM}
Reply:
```python
cows = 37
bought = 45
print(cows + bought)
```"""
SMALL_CODE_EXECUTOR_INSTRUCTION = "Write the ```python block for the problem above: use its numbers, print the answer."
SMALL_CODE_EXECUTOR_CONTINUE = (
    "That is your code's output. If it failed, write a corrected ```python block; otherwise say in one sentence "
    "what number it printed."
)

SMALL_VERIFIER_SYSTEM = f"""You give the team's final answer to a math word problem. Compare the solver's answer \
with the number the code printed; when they differ, trust the code. Reply in one sentence ending with the answer \
in \\boxed{{}}.

Example.
Problem: {SMALL_EXAMPLE_PROBLEM}
The solver answered \\boxed{{80}}; the code printed 82.
Reply: The code printed 82, so the answer is \\boxed{{82}}."""
SMALL_VERIFIER_INSTRUCTION = "Give the final answer to the problem above as in the example, in \\boxed{}."

STYLES = ("paper", "small")
"""``prompt_style`` values of MathChat: the paper's prompts (the default, for AIME/AMC) or the small-model style."""
