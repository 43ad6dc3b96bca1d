# Questions of the bench-recall ingredients, part A: single-session-user,
# single-session-assistant, single-session-preference. `ev(date, turns)` is an
# evidence session; a turn marked True holds the answer.
U, A = "user", "assistant"

def ev(date, *turns):
    return {"date": date, "turns": [{"role": r, "content": c, **({"has_answer": True} if h else {})} for r, c, *rest in turns for h in [bool(rest and rest[0])]]}

def q(qid, qtype, question, answer, date, *evidence):
    return {"question_id": qid, "question_type": qtype, "question": question, "answer": answer, "question_date": date, "evidence": list(evidence)}

SSU = "single-session-user"
SSA = "single-session-assistant"
SSP = "single-session-preference"

QUESTIONS_A = [
 q("ssu-01", SSU, "What breed is my dog?", "A border collie", "2024/05/20 (Mon) 18:00",
   ev("2024/03/02 (Sat) 10:15", (U, "My border collie, Juno, gets bored on rainy days. Any indoor games?", True), (A, "Try hide-and-seek with treats, a flirt pole in the hallway, or teaching new tricks like 'tidy up' with her toys."), (U, "She already knows how to ring a bell to go out."))),
 q("ssu-02", SSU, "Where did I go to university?", "The University of Edinburgh", "2024/06/01 (Sat) 09:00",
   ev("2024/02/11 (Sun) 20:30", (U, "I'm writing an alumni newsletter piece. I studied geology at the University of Edinburgh and graduated in 2012.", True), (A, "Happy to help. What angle do you want: career path, memories of field trips, or advice for students?"), (U, "Field trips, definitely. Arthur's Seat was our classroom."))),
 q("ssu-03", SSU, "How long is my commute to work?", "About 35 minutes by train", "2024/05/10 (Fri) 08:00",
   ev("2024/04/03 (Wed) 07:40", (U, "I have a 35-minute train commute each way and want to use it better. Any ideas?", True), (A, "Podcasts, language apps, reading, or planning your day. Offline downloads help if the signal is patchy."), (U, "The signal is terrible in the tunnel, so offline it is."))),
 q("ssu-04", SSU, "What instrument am I learning?", "The cello", "2024/05/28 (Tue) 19:00",
   ev("2024/01/20 (Sat) 16:00", (U, "I started cello lessons in January and my bow keeps squeaking on the A string.", True), (A, "Squeaks usually come from too little weight or bowing too close to the fingerboard. Try sounding point halfway to the bridge and more arm weight."), (U, "My teacher said the same about the bridge."))),
 q("ssu-05", SSU, "What is my sister's name?", "Ingrid", "2024/04/30 (Tue) 12:00",
   ev("2024/03/18 (Mon) 21:10", (U, "My sister Ingrid is turning 40 and I want to plan a surprise dinner.", True), (A, "Lovely! How many guests, and does she have a favourite cuisine?"), (U, "About twelve people. She loves Lebanese food."))),
 q("ssu-06", SSU, "Which company do I work for?", "Northwind Logistics", "2024/06/10 (Mon) 10:00",
   ev("2024/02/27 (Tue) 13:00", (U, "I'm a data analyst at Northwind Logistics and I need to explain a dip in on-time deliveries to management.", True), (A, "Start with the headline number, then break it down by region and carrier, and end with the likely causes and next steps."), (U, "The dip is mostly one carrier in the northern region."))),
 q("ssu-07", SSU, "What is the name of my cat?", "Biscotti", "2024/05/05 (Sun) 11:00",
   ev("2024/04/14 (Sun) 09:30", (U, "Biscotti, my cat, has started scratching the sofa. How do I stop her?", True), (A, "Give her a tall, sturdy scratching post right next to the sofa and reward her for using it; double-sided tape on the sofa helps meanwhile."), (U, "She ignores the small post we have."))),
 q("ssu-08", SSU, "What car do I drive?", "A 2019 Mazda 3", "2024/05/22 (Wed) 17:30",
   ev("2024/01/08 (Mon) 08:45", (U, "The check engine light came on in my 2019 Mazda 3 this morning. Is it safe to drive?", True), (A, "If it's steady rather than flashing and the car drives normally, it's usually fine for a short trip to a mechanic. A flashing light means stop."), (U, "It's steady. I'll book a garage."))),
 q("ssu-09", SSU, "How many kids do I have?", "Three", "2024/06/03 (Mon) 19:00",
   ev("2024/03/29 (Fri) 18:20", (U, "Packing for a road trip with our three kids is chaos. Can you make a checklist?", True), (A, "Snacks and water, chargers, a first-aid kit, wipes, a change of clothes per child, car games, and a bag for rubbish."), (U, "Add motion sickness bands, the youngest needs them."))),
 q("ssu-10", SSU, "What is my blood type?", "O negative", "2024/05/15 (Wed) 14:00",
   ev("2024/02/19 (Mon) 12:00", (U, "I'm O negative and the blood bank keeps calling me. How often can I donate?", True), (A, "Whole blood typically every 12 weeks for men and 16 for women in many countries; check your local service's rules."), (U, "Good to know, they said every 12 weeks."))),

 q("ssa-01", SSA, "Which book did you recommend for learning about habits?", "Atomic Habits by James Clear", "2024/05/18 (Sat) 10:00",
   ev("2024/04/02 (Tue) 22:00", (U, "I want to build better habits. Is there a book you'd suggest?"), (A, "Atomic Habits by James Clear is a practical place to start: small changes, habit stacking and designing your environment.", True), (U, "Thanks, I'll look for it at the library."))),
 q("ssa-02", SSA, "What temperature did you tell me to roast the vegetables at?", "220 °C", "2024/05/02 (Thu) 17:00",
   ev("2024/03/10 (Sun) 18:30", (U, "How do I get crispy roasted vegetables instead of soggy ones?"), (A, "Cut them evenly, dry them well, toss with oil, spread them out on the tray and roast at 220 °C, turning once halfway.", True), (U, "I always crowd the tray, that's probably it."))),
 q("ssa-03", SSA, "What was the name of the hiking trail you suggested near Lake Como?", "The Greenway del Lago di Como", "2024/06/05 (Wed) 09:00",
   ev("2024/04/25 (Thu) 20:00", (U, "We'll be near Lake Como for a weekend. Any easy hike with views?"), (A, "The Greenway del Lago di Como is an easy 10-kilometre walk between Colonno and Cadenabbia with lake views and villages along the way.", True), (U, "Perfect for my parents."))),
 q("ssa-04", SSA, "Which command did you give me to undo my last git commit but keep the changes?", "git reset --soft HEAD~1", "2024/05/12 (Sun) 15:00",
   ev("2024/02/06 (Tue) 11:20", (U, "I committed to the wrong branch. How do I undo the commit but keep my changes?"), (A, "Run git reset --soft HEAD~1. The commit is removed and your changes stay staged, ready to commit on the right branch.", True), (U, "That worked, thanks."))),
 q("ssa-05", SSA, "How many minutes did you say to boil the eggs for jammy yolks?", "Six and a half minutes", "2024/05/25 (Sat) 08:30",
   ev("2024/03/23 (Sat) 09:00", (U, "I want eggs with jammy yolks for ramen."), (A, "Lower them into boiling water for six and a half minutes, then straight into ice water.", True), (U, "Then marinate them in soy and mirin?"), (A, "Yes, overnight in the fridge."))),
 q("ssa-06", SSA, "What stretch did you recommend for my lower back?", "The child's pose", "2024/06/08 (Sat) 07:30",
   ev("2024/05/01 (Wed) 07:10", (U, "My lower back is stiff every morning. One stretch to start the day?"), (A, "Try child's pose: kneel, sit back on your heels and reach your arms forward, breathing slowly for a minute.", True), (U, "I'll do it before coffee."))),
 q("ssa-07", SSA, "Which city did you suggest as a cheaper alternative to Copenhagen?", "Aarhus", "2024/05/30 (Thu) 12:00",
   ev("2024/02/14 (Wed) 19:45", (U, "Copenhagen hotels are so expensive in July. Alternatives in Denmark?"), (A, "Aarhus is a good alternative: cheaper hotels, the ARoS art museum with its rainbow walkway, and a lively old town.", True), (U, "How far is it by train?"), (A, "About three hours from Copenhagen."))),
 q("ssa-08", SSA, "What name did you come up with for my newsletter?", "The Sunday Compass", "2024/06/02 (Sun) 10:00",
   ev("2024/04/07 (Sun) 14:00", (U, "I'm starting a weekly newsletter about personal finance for young people. Name ideas?"), (A, "How about 'The Sunday Compass': it arrives on Sundays and helps readers find their financial direction.", True), (U, "I like that one a lot."))),

 q("ssp-01", SSP, "Can you suggest a dinner recipe for tonight?", "The user is vegetarian and dislikes mushrooms; suggest a vegetarian dish without mushrooms.", "2024/05/14 (Tue) 17:30",
   ev("2024/03/05 (Tue) 18:00", (U, "I've been vegetarian for years, but I can't stand mushrooms, their texture makes me gag.", True), (A, "Noted! Lentils, chickpeas, halloumi and roasted aubergine can give you that hearty bite instead."), (U, "Halloumi is a favourite."))),
 q("ssp-02", SSP, "Recommend me a podcast for my morning walk.", "The user likes short science podcasts under 20 minutes.", "2024/06/04 (Tue) 07:00",
   ev("2024/02/22 (Thu) 08:00", (U, "I only listen to short science podcasts, anything over 20 minutes loses me.", True), (A, "Short Wave from NPR and 'Science Vs' shorter episodes fit that well."), (U, "Short Wave is great."))),
 q("ssp-03", SSP, "What should I get for my new home office chair?", "The user has lower back pain and prefers mesh chairs with lumbar support.", "2024/05/09 (Thu) 13:00",
   ev("2024/01/30 (Tue) 16:30", (U, "Sitting all day hurts my lower back. I prefer mesh chairs, foam ones make me too warm.", True), (A, "Look for adjustable lumbar support, seat depth adjustment and a breathable mesh back."), (U, "Budget is around 400."))),
 q("ssp-04", SSP, "Suggest a weekend trip for me.", "The user prefers quiet nature destinations by train and avoids flying.", "2024/05/23 (Thu) 20:00",
   ev("2024/03/14 (Thu) 21:00", (U, "I try not to fly anymore, and I'd rather go somewhere quiet in nature than a big city.", True), (A, "Train-friendly nature trips could suit you: national parks, lake districts or coastal walks reachable by rail."), (U, "Exactly my kind of trip."))),
 q("ssp-05", SSP, "What wine should I bring to the dinner party?", "The user prefers dry white wines, especially Riesling.", "2024/06/07 (Fri) 16:00",
   ev("2024/04/19 (Fri) 19:30", (U, "I don't enjoy red wine at all. A dry Riesling is my go-to.", True), (A, "Dry Rieslings from the Mosel or Clare Valley are crisp and food-friendly."), (U, "Clare Valley ones are lovely."))),
 q("ssp-06", SSP, "Recommend a TV series to watch this weekend.", "The user likes slow-burn detective dramas and dislikes comedies.", "2024/05/17 (Fri) 21:00",
   ev("2024/02/03 (Sat) 22:15", (U, "I'm in the mood for a slow-burn detective drama. Sitcoms and comedies never work for me.", True), (A, "Broadchurch, Mare of Easttown or The Killing are all slow-burn and character-driven."), (U, "Loved Broadchurch."))),
 q("ssp-07", SSP, "What workout should I do today?", "The user has a bad knee, avoids running and likes swimming.", "2024/05/27 (Mon) 06:30",
   ev("2024/03/26 (Tue) 07:00", (U, "My left knee can't take running anymore since the surgery. Swimming is the one thing that feels good.", True), (A, "Then swimming intervals, cycling on low resistance and upper-body strength work are good options."), (U, "I swim three mornings a week now."))),
 q("ssp-08", SSP, "Which laptop should I buy for work?", "The user wants a lightweight Linux laptop with a long battery life.", "2024/06/09 (Sun) 11:00",
   ev("2024/04/11 (Thu) 10:00", (U, "I travel constantly, so weight and battery life matter most, and I run Linux only.", True), (A, "Models with good Linux support and long battery life include the ThinkPad X1 Carbon and Framework 13."), (U, "The Framework looks interesting."))),
]
