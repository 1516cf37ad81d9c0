"""Labelled examples from three policy pipelines, in the shape `onepass calibrate` reads, for fitting runs
as a user makes them: phishing emails, policy compliance and multilingual support tickets.

    .venv/bin/python -m bench.policy_examples --out examples.jsonl [--per-pipeline 80] [--seed 0] [--pipeline tickets]

Unlike bench/pipelines.py, one pipeline's question is not the same question from item to item: in
the compliance pipeline every case quotes its own policy, so "which clause was violated" offers that
policy's clauses, and each policy is a question of its own to a fit (fits are matched by content).
Some policies are common and some come up once or twice, as in a real compliance queue. Every
answer is computed from the item's slots by the policy its question states.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

Example = dict[str, Any]

# Phishing emails -------------------------------------------------------------------------------

PHISHING_QUESTIONS: dict[str, Any] = {
    "phishing": {
        "type": "noul",
        "instructions": "Policy: an email is phishing when it comes from outside example-corp.com and asks for a "
        "password, a code or payment details, or links to a domain that is not the sender's. Is this email phishing?",
    },
    "action": {
        "type": "choice",
        "instructions": "What should the mail gateway do with this email?",
        "criteria": {
            "Deliver": "internal mail, or external mail that is not phishing",
            "Quarantine": "phishing that names no executive",
            "Report": "phishing that pretends to come from an executive: send it to the security team",
        },
    },
    "spoofed": {
        "type": "noul",
        "instructions": "Does the sender's name claim to be a person at Example Corp while the address is outside "
        "example-corp.com?",
    },
    "risk": {
        "type": "score",
        "instructions": "Policy: high when it asks for payment details; medium when it asks for a password or "
        "code; low when it only links elsewhere; none otherwise. How risky is this email?",
        "criteria": ["none", "low", "medium", "high"],
    },
}
PEOPLE = [("Dana Whitfield", "CEO"), ("Marc Olsen", "CFO"), ("Priya Raman", "IT helpdesk"), ("Leo Kim", "HR")]
DOMAINS = ["example-corp.com", "examp1e-corp.com", "example-corp.support", "mailer.shipfast.net", "gmail.com"]
ASKS = {
    "payment": ["Please confirm the card number for the vendor payment today.", "Send the IBAN for the refund."],
    "password": ["Reply with your password so I can fix your mailbox.", "Tell me the code we just texted you."],
    "link": ["The shared document is at {link}.", "Your parcel is waiting, track it at {link}."],
    "none": ["The meeting moved to 3 pm.", "Thanks for the quick turnaround on the report."],
}


def _phishing(rng: random.Random) -> tuple[str, dict[str, Any], dict[str, Any]]:
    name, role = rng.choice(PEOPLE)
    claims_staff = rng.random() < 0.6
    domain = rng.choice(DOMAINS)
    ask = rng.choice(list(ASKS))
    link_domain = domain if rng.random() < 0.4 else rng.choice(["docs-share.io", "track-parcel.co", domain])
    sender = f"{name} ({role})" if claims_staff else rng.choice(["Parcel Service", "Billing Team", "Newsletter"])
    body = rng.choice(ASKS[ask]).format(link=f"https://{link_domain}/x{rng.randint(100, 999)}")
    subject = rng.choice(["Urgent", "Hi", "Update"])
    text = f"From: {sender} <{name.split()[0].lower()}@{domain}>\nSubject: {subject}\n\n{body}"
    external = domain != "example-corp.com"
    other_link = ask == "link" and link_domain != domain
    phishing = external and (ask in ("payment", "password") or other_link)
    executive = claims_staff and role in ("CEO", "CFO")
    answers = {
        "phishing": phishing,
        "action": "Report" if phishing and executive else "Quarantine" if phishing else "Deliver",
        "spoofed": claims_staff and external,
        "risk": {"payment": 3, "password": 2, "link": 1 if other_link else 0, "none": 0}[ask] if external else 0,
    }
    return text, PHISHING_QUESTIONS, answers


# Policy compliance -----------------------------------------------------------------------------

# (policy, its clauses, how often a case comes under it): a few policies take most cases.
POLICIES = [
    ("Travel", ["Receipts within 30 days", "Economy class under 6 hours", "Approval before booking"], 19),
    ("Expenses", ["Per diem limit", "No alcohol", "Mileage log"], 14),
    ("Gifts", ["Value under $50", "Disclosure", "No cash"], 10),
    ("Remote work", ["Core hours", "Approved country", "Secure network"], 8),
    ("Data handling", ["Encryption at rest", "No personal email", "Retention limit", "Access review"], 6),
    ("Conflicts of interest", ["Disclosure of outside work", "No family hires"], 5),
    ("Procurement", ["Three quotes over $10,000", "Approved vendors"], 4),
    ("Social media", ["No client names", "Personal opinion disclaimer"], 3),
    ("Overtime", ["Prior approval", "Weekly cap"], 3),
    ("Devices", ["Screen lock", "No unapproved apps", "Report loss within 24 hours"], 2),
    ("Visitors", ["Badge at all times", "Escort in labs"], 2),
    ("Training", ["Annual security course", "Onboarding within 30 days"], 1),
    ("Fleet cars", ["Logbook", "No private trips abroad"], 1),
    ("Recording", ["Consent of all parties", "Storage on approved drives"], 1),
    ("Hiring", ["Structured interview", "Two interviewers"], 1),
    ("Whistleblowing", ["Anonymous channel", "No retaliation"], 1),
]
DEPARTMENTS = {"Travel": "Finance", "Expenses": "Finance", "Gifts": "Legal", "Procurement": "Finance"}


def _compliance(rng: random.Random) -> tuple[str, dict[str, Any], dict[str, Any]]:
    name, clauses, _ = rng.choices(POLICIES, weights=[p[2] for p in POLICIES])[0]
    violated = rng.choice(clauses) if rng.random() < 0.8 else None
    repeat = violated is not None and rng.random() < 0.3
    amount = rng.choice([40, 120, 900, 4000, 15000])
    clause_text = "; ".join(f"({i + 1}) {c}" for i, c in enumerate(clauses))
    if violated is None:
        case = "The employee followed every clause."
    else:
        case = f"The employee broke clause '{violated}'" + (" for the second time this year" if repeat else "") + "."
    text = f"Policy: {name}. Clauses: {clause_text}.\nCase: {case} Amount involved: ${amount}."
    department = DEPARTMENTS.get(name, "IT" if name in ("Devices", "Data handling", "Recording") else "HR")
    severity = 0 if violated is None else 2 if repeat or amount > 1000 else 1
    questions = {
        "violation": {"type": "noul", "instructions": "Did the employee violate the policy?"},
        "clause": {
            "type": "choice",
            "instructions": "Which clause of the policy was violated?",
            "criteria": {**{c: None for c in clauses}, "None": "no clause was violated"},
        },
        "severity": {
            "type": "score",
            "instructions": "Policy: major for a repeated violation or one involving more than $1,000; minor for "
            "any other violation; none when nothing was violated. How severe is it?",
            "criteria": ["none", "minor", "major"],
        },
        "report": {
            "type": "noul",
            "instructions": "Policy: report a case to the compliance officer when it is a major violation. "
            "Must this case be reported?",
        },
        "department": {
            "type": "choice",
            "instructions": "Which department reviews cases under this policy?",
            "criteria": {
                "Finance": "travel, expenses, procurement",
                "Legal": "gifts",
                "IT": "devices, data handling, recording",
                "HR": "every other policy",
            },
        },
    }
    answers = {
        "violation": violated is not None,
        "clause": violated or "None",
        "severity": severity,
        "report": severity == 2,
        "department": department,
    }
    return text, questions, answers


# Multilingual support tickets ------------------------------------------------------------------

TICKET_QUESTIONS: dict[str, Any] = {
    "language": {
        "type": "choice",
        "instructions": "Which language is the ticket written in?",
        "criteria": {"English": None, "German": None, "French": None, "Spanish": None},
    },
    "queue": {
        "type": "choice",
        "instructions": "Which queue handles this ticket?",
        "criteria": {"Billing": "charges and refunds", "Shipping": "late or damaged parcels", "Account": "login"},
    },
    "refund": {
        "type": "noul",
        "instructions": "Policy: offer a refund when the parcel arrived damaged, or more than 14 days late, or "
        "when the customer was charged twice. Should we offer a refund?",
    },
    "translate": {
        "type": "noul",
        "instructions": "Policy: tickets not in English go to a translator first. Does this one?",
    },
    "urgency": {
        "type": "score",
        "instructions": "Policy: high when the customer was charged twice or cannot log in; medium when a parcel is "
        "late or damaged; low otherwise. How urgent is the ticket?",
        "criteria": ["low", "medium", "high"],
    },
}
TICKETS = {  # language -> issue -> text ({days}: how late)
    "English": {
        "damaged": "My parcel arrived damaged, the box was crushed.",
        "late": "My parcel is {days} days late.",
        "double": "You charged my card twice for one order.",
        "login": "I cannot log in to my account anymore.",
        "invoice": "Could you send me the invoice for my last order?",
    },
    "German": {
        "damaged": "Mein Paket kam beschädigt an, der Karton war zerdrückt.",
        "late": "Mein Paket ist {days} Tage zu spät.",
        "double": "Sie haben meine Karte für eine Bestellung zweimal belastet.",
        "login": "Ich kann mich nicht mehr in mein Konto einloggen.",
        "invoice": "Könnten Sie mir die Rechnung für meine letzte Bestellung schicken?",
    },
    "French": {
        "damaged": "Mon colis est arrivé abîmé, le carton était écrasé.",
        "late": "Mon colis a {days} jours de retard.",
        "double": "Vous avez débité ma carte deux fois pour une seule commande.",
        "login": "Je n'arrive plus à me connecter à mon compte.",
        "invoice": "Pourriez-vous m'envoyer la facture de ma dernière commande ?",
    },
    "Spanish": {
        "damaged": "Mi paquete llegó dañado, la caja estaba aplastada.",
        "late": "Mi paquete lleva {days} días de retraso.",
        "double": "Me cobraron dos veces en la tarjeta por un solo pedido.",
        "login": "Ya no puedo iniciar sesión en mi cuenta.",
        "invoice": "¿Podrían enviarme la factura de mi último pedido?",
    },
}


def _ticket(rng: random.Random) -> tuple[str, dict[str, Any], dict[str, Any]]:
    language = rng.choice(list(TICKETS))
    issue = rng.choice(list(TICKETS[language]))
    days = rng.choice([3, 9, 16, 25])
    text = TICKETS[language][issue].format(days=days) + f" #{rng.randint(10000, 99999)}"
    answers = {
        "language": language,
        "queue": {"damaged": "Shipping", "late": "Shipping", "login": "Account"}.get(issue, "Billing"),
        "refund": issue in ("damaged", "double") or (issue == "late" and days > 14),
        "translate": language != "English",
        "urgency": 2 if issue in ("double", "login") else 1 if issue in ("damaged", "late") else 0,
    }
    return text, TICKET_QUESTIONS, answers


PIPELINES = {"phishing": _phishing, "compliance": _compliance, "tickets": _ticket}


def examples(per_pipeline: int, seed: int = 0, pipelines: Sequence[str] = tuple(PIPELINES)) -> list[Example]:
    found = []
    for name in pipelines:
        make = PIPELINES[name]
        rng = random.Random(f"{name}-{seed}")
        for _ in range(per_pipeline):
            state, questions, answers = make(rng)
            found.append({"state": state, "questions": questions, "answers": answers})
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--per-pipeline", type=int, default=80)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--pipeline", action="append", choices=tuple(PIPELINES), help="only this pipeline's (repeatable; default: all)"
    )
    args = parser.parse_args()
    found = examples(args.per_pipeline, args.seed, args.pipeline or tuple(PIPELINES))
    args.out.write_text("".join(json.dumps(e, ensure_ascii=False) + "\n" for e in found), encoding="utf-8")
    print(f"{len(found)} examples written to {args.out}")


if __name__ == "__main__":
    main()
